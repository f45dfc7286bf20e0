"""Decode text with named checkpoints for a person to read, alone or plain beside speculative.

:func:`complete` continues one prompt (what ``minispec generate`` prints); :func:`demo` times plain
against speculative decoding of one prompt, shows which tokens the draft got right, and sweeps the
batch size to find where speculation stops paying here (what ``minispec demo`` prints). Checkpoints
are named as :func:`minispec.tools.pair.load_pair` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.decoding.plain import generate
from minispec.decoding.sampling import SamplingParams
from minispec.decoding.stats import Stats
from minispec.roofline.hardware import device_hardware
from minispec.speculative.loop import speculative_generate
from minispec.tools.bench import BenchConfig, bench_point, break_even, format_table, prompts_for, sweep
from minispec.tools.pair import check_pair, load_pair, prompt_tokens


@dataclass(frozen=True)
class Completion:
    """What :func:`complete` produced; ``str()`` is the text, accepted draft tokens marked when asked."""

    text: str  # the prompt and its continuation; a chat model's answer alone
    stats: Stats
    marked: str | None = None  # the text with accepted draft tokens marked (``mark``), else None
    continuation: str | None = None  # what the model wrote (the text less the prompt)

    def __str__(self) -> str:
        return self.text if self.marked is None else self.marked

    @property
    def hint(self) -> str | None:
        """One line for a person who sees only whitespace come out (None otherwise): a small model decoded greedily
        often repeats indentation after a short opening (the embedded 3.3M code model does after 'def fib(n):')."""
        if not self.continuation or self.continuation.strip():
            return None
        return ("the continuation is only whitespace: greedy decoding of a small model often repeats indentation "
                "after a short opening. Give it more to continue (a function head and its first line, e.g. "
                "'def _current(self):\\n') or sample (--temperature 0.8)")

    def summary(self) -> str:
        """The run's numbers, one a line."""
        s = self.stats
        lines = [("new tokens", f"{s.num_output_tokens}"), ("tokens/s", f"{s.output_throughput:.1f}"),
                 ("TTFT", f"{1e3 * s.ttft_s:.1f} ms"), ("TPOT p50", f"{1e3 * s.tpot_p50_s:.1f} ms"),
                 ("torch threads", f"{torch.get_num_threads()}")]
        if s.num_drafts is not None:
            lines.append(("draft", s.draft))
            if s.tree_depth is None:
                lines += [("gamma", f"{s.gamma}"), ("acceptance rate", _rate(s.acceptance_rate))]
            else:
                lines += [("tree", f"depth {s.tree_depth}, {s.tree_nodes} nodes per step"),
                          ("acceptance rate (path)", _rate(s.acceptance_rate)),
                          ("node acceptance rate", _rate(s.node_acceptance_rate))]
            lines.append(("mean acceptance length", f"{s.mean_acceptance_length or 1:.2f}"))
        return "\n".join(f"{k:>24}  {v}" for k, v in lines)


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def complete(prompt: str, model: str = "tiny-code-target", draft: str | None = None, gamma: int | str | None = None,
             max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, chat: bool | None = None, device=None,
             dtype=None, tree: dict | str | None = None, hot_vocab: int | None = None,
             mark: str | None = None) -> Completion:
    """Continue ``prompt`` with ``model``, speculatively when a ``draft`` is named (``gamma`` as in
    :func:`minispec.speculative_generate`; ``tree`` and ``hot_vocab`` as :func:`minispec.tools.pair.load_pair`
    takes them), stopping at the tokenizer's end-of-sequence token.

    ``chat``: wrap the prompt in the tokenizer's chat template as a user turn (default: when it has
    one; an instruct model answers a bare prompt with its end-of-turn token at once). ``mark``: also
    mark the accepted draft tokens, ``"color"`` (ANSI green), ``"carets"`` (a line of ^ under the characters
    that came from accepted draft tokens, below each line that has any) or ``"brackets"`` (between « »).
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"the prompt is empty: give text to continue (a chat model: a question), got {prompt!r}")
    if model.startswith("shape:"):
        raise ValueError(f"{model} is random weights with no tokenizer; a text prompt needs a checkpoint")
    if mark not in (None, "color", "carets", "brackets"):
        raise ValueError(f"mark must be None, 'color', 'carets' or 'brackets', got {mark!r}")
    if mark is not None and draft is None:
        raise ValueError("marking accepted draft tokens needs a draft: name one")
    SamplingParams(temperature, top_k, top_p)  # checked before anything loads, as the names are
    limit = check_pair(model, draft, device, dtype, tree, hot_vocab).max_positions
    if limit is not None and max_new_tokens >= limit:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt within {model}'s maximum "
                         f"length of {limit} positions")
    target, tok, drafter = load_pair(model, draft, device, dtype, tree, hot_vocab)
    if tok is None:
        raise ValueError(f"{model} has no tokenizer files; cannot encode a text prompt")
    template = getattr(tok, "chat_template", None) is not None
    if chat and not template:
        raise ValueError(f"{model}'s tokenizer has no chat template")
    chat = template if chat is None else chat
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        ids = tok.encode(prompt)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
              eos_token_id=tok.eos_token_id)
    if drafter is None:
        res = generate(target, [ids], **kw)
    else:
        res = speculative_generate(target, drafter, [ids], gamma=gamma, **kw)
    head = "" if chat else prompt
    continuation = tok.decode(res.tokens[0], skip_special_tokens=True)
    marked = None if mark is None else _marked(tok, res.tokens[0], res.accepted[0], mark, head)
    return Completion(head + continuation, res.stats, marked, continuation)


@dataclass(frozen=True)
class Demo:
    """What :func:`demo` measured; ``str()`` is the side-by-side report."""

    header: str  # the pair, the setting and the device
    point: dict  # plain and speculative at batch 1: :func:`minispec.tools.bench.bench_point`'s row
    text: str  # the prompt and the speculative continuation, accepted draft tokens marked
    color: bool  # marked in green (a terminal), else by a line of ^ under each line
    sweep: list[dict]  # the batch sweep's rows (none when no batches were given)

    def __str__(self) -> str:
        r, lines = self.point, [self.header, "", f"{'':24}{'plain':>12}{'speculative':>14}"]
        for name, plain, spec, fmt in (("output tokens/s", "plain_output_throughput", "output_throughput", "{:.0f}"),
                                       ("TTFT ms", "plain_mean_ttft_ms", "mean_ttft_ms", "{:.2f}"),
                                       ("TPOT p50 ms", "plain_median_tpot_ms", "median_tpot_ms", "{:.2f}"),
                                       ("TPOT p99 ms", "plain_p99_tpot_ms", "p99_tpot_ms", "{:.2f}")):
            lines.append(f"{name:24}{fmt.format(r[plain]):>12}{fmt.format(r[spec]):>14}")
        for name, key in (("acceptance rate", "acceptance_rate"), ("mean acceptance length", "mean_acceptance_length")):
            lines.append(f"{name:24}{'':>12}{'-' if r[key] is None else format(r[key], '.2f'):>14}")
        lines.append(f"{'per-position acceptance':24}{'':>12}  "
                     + " ".join(f"{a:.2f}" for a in r["per_position_acceptance_rates"]))
        lines += ["  (acceptance rate: accepted / drafted tokens, vLLM's figure; mean acceptance length: tokens a step",
                  "   emits, 1 + accepted / steps; per-position: the share of steps whose i-th draft token was",
                  "   accepted, with every one before it; alpha, below: accepted / tested, counting only the draft",
                  "   tokens the accept test reached, up to each step's first rejection)"]
        for phase in dict.fromkeys([*r["plain_phase_s"], *r["phase_s"]]):
            cells = [f"{1e3 * d[phase]:.1f}" if phase in d else "" for d in (r["plain_phase_s"], r["phase_s"])]
            lines.append(f"{'time in ' + phase + ' ms':24}{cells[0]:>12}{cells[1]:>14}")
        lines.append(f"\nmeasured speedup: {r['speedup']:.2f}x")
        if r["alpha_estimate"] is not None:
            lines.append(f"Leviathan et al.: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) with measured "
                         f"alpha = {r['alpha_estimate']:.2f} (accepted / tested) and c = {r['draft_cost_c']:.3f} "
                         f"(draft pass / plain decode step, both timed in the loops) predicts "
                         f"{r['leviathan_speedup']:.2f}x; measured / predicted = "
                         f"{r['speedup'] / r['leviathan_speedup']:.2f}")
        marks = "in green" if self.color else "marked by a ^ under each of their characters"
        lines += [f"\ngenerated text (accepted draft tokens {marks}):\n", self.text + "\n"]
        if self.sweep:
            be = break_even(self.sweep)
            lines += [f"batch sweep ({self.sweep[0]['max_new_tokens']} new tokens per row): where speculation "
                      "stops paying here", format_table(self.sweep),
                      "measured break-even batch: " + (f"about {be:.0f}" if be else "not within the sweep")]
        return "\n".join(lines)


def demo(target: str = "tiny-code-target", draft: str = "tiny-code-draft", gamma: int = 4, max_new_tokens: int = 128,
         temperature: float = 0.0, prompt: str | None = None, prompt_len: int = 64, repeats: int = 3,
         batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), device=None, dtype=None, color: bool = False) -> Demo:
    """Plain against speculative decoding of one prompt (``prompt``, default ``prompt_len`` tokens of the
    shipped held-out code), medians of ``repeats`` runs; then, unless ``batches`` is empty, a sweep over
    ``batches`` of up to 48 new tokens per row. ``color``: mark accepted draft tokens with ANSI green."""
    if draft is None:
        raise ValueError("the demo sets speculative decoding beside plain decoding: name a draft")
    if target.startswith("shape:"):
        raise ValueError(f"{target} is random weights with no tokenizer; the demo shows text: name a checkpoint")
    cfg = BenchConfig(batches=(1,), gammas=(gamma,), temperatures=(temperature,), max_new_tokens=max_new_tokens,
                      prompt_len=prompt_len, repeats=repeats, warmup=1)
    sweep_cfg = batches and BenchConfig(batches=tuple(batches), gammas=(gamma,), temperatures=(temperature,),
                                        max_new_tokens=min(48, max_new_tokens), prompt_len=prompt_len, repeats=1)
    model, tok, drafter = load_pair(target, draft, device, dtype)
    if tok is None:
        raise ValueError(f"{target} has no tokenizer: the demo shows text")
    tokens = prompt_tokens(tok)
    ids = tok.encode(prompt) if prompt else prompts_for(1, prompt_len, model.config.vocab_size, tokens)[0]
    point = bench_point(model, drafter, [ids], gamma, temperature, cfg, device_hardware(model.device, model.dtype))
    spec = speculative_generate(model, drafter, [ids], gamma=gamma, max_new_tokens=max_new_tokens,
                                temperature=temperature, seed=0)
    header = (f"minispec demo: target {target} ({model.config.num_parameters / 1e6:.2f}M parameters), draft "
              f"{point['draft']}, batch 1, gamma {gamma}, temperature {temperature}, {max_new_tokens} new tokens, "
              f"{model.device} {str(model.dtype).removeprefix('torch.')}"
              + (f", torch threads {torch.get_num_threads()}" if model.device.type == "cpu" else "")
              + f", median of {repeats} runs")
    text = _marked(tok, spec.tokens[0], spec.accepted[0], "color" if color else "carets", tok.decode(ids))
    rows = sweep(model, drafter, sweep_cfg, tokens, progress=False) if sweep_cfg else []
    return Demo(header, point, text, color, rows)


def _marked(tok, tokens: list[int], accepted: list[bool], mark: str, head: str = "") -> str:
    """``head``, then the tokens decoded, with the accepted draft tokens marked: ``"color"`` (ANSI green),
    ``"carets"`` (under each line that has any, a line with ^ under each of their characters; the text's own lines
    are left as they are, so runs of whitespace stay readable) or ``"brackets"`` (between « »). Tokens are decoded
    a run of the same kind at a time, so a multi-byte character inside a run stays whole."""
    runs, run, kind = [], [], None
    for t, a in zip(tokens, accepted):
        if run and a != kind:
            runs.append((tok.decode(run, skip_special_tokens=True), kind))
            run = []
        run.append(t)
        kind = a
    if run:
        runs.append((tok.decode(run, skip_special_tokens=True), kind))
    if mark != "carets":
        wrap = (lambda x: f"\x1b[32m{x}\x1b[0m") if mark == "color" else (lambda x: f"«{x}»")
        return head + "".join(wrap(text) if a and text else text for text, a in runs)
    out, line, under = [], "", ""
    for text, a in [(head, False), *runs]:
        for ch in text:
            line += ch
            under += "^" if a else ("\t" if ch == "\t" else " ")
            if ch == "\n":
                out.append(line + (under.rstrip() + "\n" if "^" in under else ""))
                line, under = "", ""
    return "".join(out) + line + ("\n" + under.rstrip() if "^" in under else "")
