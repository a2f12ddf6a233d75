"""Named build specs (``fixed_sft/builds/``) and pinned tokenizer specs (``fixed_sft/tokenizer_specs/``).

Both ship inside the package (``importlib.resources``), so any install reads them.

A tokenizer is *pinned* when each of its files has the bytes and sha256 of a spec.
Files that differ from the spec they should match are refused unless the caller
allows unpinned tokenizers, in which case the difference is recorded.

A tokenizer is of one of two families: ``kimi`` (``tiktoken.model``, encoded by the Kimi fast
path, ``fixed_sft.chat``) or ``hf`` (a Hugging Face fast tokenizer, ``tokenizer.json``, encoded
by rendering its chat template, ``fixed_sft.hf_chat``). A folder's family is the file it holds;
a spec names its own (``kimi`` when it does not).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .chat import MASK_TYPES as KIMI_MASK_TYPES
from .encoding import TemplateMismatch
from .errors import UsageError
from .fields import FieldError, decode, read_json_object
from .hashes import sha256_file
from .hf_chat import ADDITIONAL_TEMPLATES, remote_code_files, tokenizer_files
from .hf_chat import MASK_TYPES as HF_MASK_TYPES
from .hf_chat import OPTIONAL_FILES as HF_OPTIONAL
from .hf_chat import REQUIRED_FILES as HF_REQUIRED
from .hub import HubUnreachable, download_files, download_folder, download_present, is_hub_id, raise_cache_damage
from .manifest import FileHash, Tokenizer
from .params import BuildSpec
from .tokenizer import FILES, TEMPLATE_KWARGS, TokenizerError
from .tool_declarations import MODEL_FILE

BUILDS = Path(str(resources.files(__package__) / "builds"))
TOKENIZERS = Path(str(resources.files(__package__) / "tokenizer_specs"))
DEFAULT_BUILD = "kimi-k26-tulu3-fixed8192-v1"
KIMI, HF = "kimi", "hf"
FAMILIES = (KIMI, HF)


class SpecError(Exception):
    """A spec or tokenizer cannot be found or read, or tokenizer files do not match their pinned spec."""


@dataclass
class TokenizerSpec:
    """A pinned tokenizer spec (``fixed_sft/tokenizer_specs/NAME.json``): the Hub repo and
    revision, each file's size and sha256, the template variables and the mask type;
    ``family``: ``kimi`` or ``hf`` (module docstring); ``code_files``: the model's remote
    code, for information (the Kimi rules are fixed_sft/tokenizer.py's)."""

    name: str
    repo: str
    revision: str
    files: dict[str, FileHash]
    template_kwargs: dict[str, Any]
    loss_mask_type: str
    code_files: dict[str, Any] | None = None
    family: str = KIMI


def _check(path: Path, spec: dict[str, Any], kind: type) -> Any:
    """``spec`` read as ``kind`` (``fields.decode``); ``SpecError`` naming the file and the first wrong key."""
    try:
        return decode(kind, spec)
    except FieldError as error:
        raise SpecError(f"{path}: {error}") from None


def _check_build(path: Path, spec: dict[str, Any]) -> None:
    _check(path, spec, BuildSpec)


def _check_tokenizer(path: Path, spec: dict[str, Any]) -> None:
    checked: TokenizerSpec = _check(path, spec, TokenizerSpec)
    if checked.name != path.stem:
        raise SpecError(f"{path}: 'name' is {checked.name!r}, not the file's name {path.stem!r}")
    if checked.family not in FAMILIES:
        raise SpecError(f"{path}: 'family' is {checked.family!r}, not one of {', '.join(FAMILIES)}")
    for name in FILES if checked.family == KIMI else HF_REQUIRED:
        if name not in checked.files:
            raise SpecError(f"{path}: 'files' needs {name} with its 'bytes' and 'sha256'")


def _load(folder: Path, name: str, kind: str, check: Callable[[Path, dict], None]) -> dict:
    """The spec ``folder/NAME.json``, read and checked (``SpecError`` naming the file otherwise)."""
    path = folder / f"{name}.json"
    if not name or Path(name).name != name or name.startswith("."):
        raise SpecError(f"{kind} name {name!r} is not a name (a file name in {folder}, without .json)")
    if not folder.is_dir():
        raise SpecError(f"{folder} not found: the package is incomplete; reinstall fixed-sft")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.json") if not p.name.startswith("."))) or "none"
        raise SpecError(f"no {kind} named {name!r} in {folder} (known: {known})")
    spec = read_json_object(path, SpecError)
    check(path, spec)
    return spec


def build_spec(name: str) -> dict:
    """The named build's spec, from ``fixed_sft/builds/NAME.json``."""
    return _load(BUILDS, name, "build spec", _check_build)


def tokenizer_spec(name: str) -> dict:
    """The named tokenizer's spec, from ``fixed_sft/tokenizer_specs/NAME.json``."""
    return _load(TOKENIZERS, name, "tokenizer spec", _check_tokenizer)


def tokenizer_specs() -> list[dict]:
    """Every tokenizer spec in ``fixed_sft/tokenizer_specs/``, in name order."""
    return [tokenizer_spec(path.stem) for path in sorted(TOKENIZERS.glob("*.json")) if not path.name.startswith(".")]


@dataclass
class ResolvedTokenizer:
    """Local tokenizer files and what the manifest records about them."""

    directory: Path
    name: str | None
    repo: str | None
    revision: str | None
    files: dict[str, dict]
    template_kwargs: dict
    loss_mask_type: str | None
    pinned: bool
    mismatches: list[str] = field(default_factory=list)
    family: str = KIMI
    declarations: tuple[str, str] | None = None  # the model's own tool-declaration encoder: path, pinned sha256

    def manifest(self) -> Tokenizer:
        """The manifest's ``tokenizer``."""
        files = {name: FileHash(**file) for name, file in self.files.items()}
        return Tokenizer(self.name, self.repo, self.revision, files, self.pinned, list(self.mismatches))


def _download(repo: str, revision: str, names: tuple[str, ...] = FILES) -> tuple[Path, str]:
    """The folder of the tokenizer files at ``revision``, and the commit it resolved to."""
    try:
        return download_files("tokenizer", repo, revision, names)
    except HubUnreachable as error:
        raise SpecError(
            f"{error}. Without the Hub, put {', '.join(names)} in a folder "
            "and pass --tokenizer FOLDER (README: 'Build offline' shows a whole offline build)."
        ) from None


def _download_any(repo: str, revision: str, trust_remote_code: bool) -> tuple[Path, str]:
    """The folder of an unpinned repo's tokenizer files at ``revision``, and the commit: the
    Kimi files where it has ``tiktoken.model``, else a Hugging Face tokenizer's, its named
    templates (``hf_chat.ADDITIONAL_TEMPLATES``) and, with ``trust_remote_code``, its code."""
    try:
        folder, commit, _ = download_present("tokenizer", repo, revision, (), ("tiktoken.model",))
        return download_present("tokenizer", repo, commit, FILES, ())[:2]
    except HubUnreachable:
        pass  # (no tiktoken.model, or none to be had: a Hugging Face tokenizer's files say which)
    try:
        folder, commit, _ = download_present("tokenizer", repo, revision, HF_REQUIRED, HF_OPTIONAL)
        download_folder("chat templates", repo, commit, ADDITIONAL_TEMPLATES, ".jinja")
        code = remote_code_files(folder / "tokenizer_config.json") if trust_remote_code else []
        if code:
            download_present("tokenizer code", repo, commit, tuple(code), ())
    except HubUnreachable as error:
        raise SpecError(
            f"{error}. Without the Hub, put the tokenizer files in a folder and pass --tokenizer FOLDER"
        ) from None
    return folder, commit


def family_of(directory: Path) -> str:
    """The family of a tokenizer folder (module docstring): ``kimi`` where it holds
    ``tiktoken.model``, else ``hf`` where it holds ``tokenizer.json``."""
    if (directory / "tiktoken.model").is_file():
        return KIMI
    if (directory / "tokenizer.json").is_file():
        return HF
    raise SpecError(f"tokenizer folder {directory} lacks tiktoken.model (Kimi) or tokenizer.json (Hugging Face)")


def folder_files(directory: Path, family: str, trust_remote_code: bool = False) -> list[str]:
    """The names of the files of a tokenizer folder that a build reads and records."""
    return list(FILES) if family == KIMI else tokenizer_files(directory, trust_remote_code)


def file_hashes(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each file's bytes and sha256, by name."""
    return {
        name: {"bytes": (directory / name).stat().st_size, "sha256": sha256_file(directory / name)} for name in names
    }


def _differences(spec: dict, files: dict[str, dict]) -> list[str]:
    """How ``files`` (name -> bytes and sha256) differ from ``spec``'s, file by file."""
    expected = spec["files"]
    found = [
        f"{name}: expected sha256 {expected[name]['sha256']} ({expected[name]['bytes']} bytes), "
        f"got {files[name]['sha256']} ({files[name]['bytes']} bytes)"
        for name in expected
        if name in files and expected[name] != files[name]
    ]
    found += [f"{name}: expected, not found" for name in expected if name not in files]
    found += [f"{name}: found, not in the spec" for name in files if name not in expected]
    return found


def resolve_tokenizer(
    tokenizer: str,
    revision: str | None = None,
    expected: str | None = None,
    allow_unpinned: bool = False,
    trust_remote_code: bool = False,
) -> ResolvedTokenizer:
    """Find the tokenizer files and check them against their pinned spec.

    ``tokenizer`` is a spec name, a local folder, or a Hub repo id. The spec the files
    must match: the named one; for a folder, ``expected`` (the build spec's tokenizer);
    for a repo id, the spec that pins that repo; failing those, any spec whose hashes
    they match."""
    specs = {spec["name"]: spec for spec in tokenizer_specs()}
    spec = specs.get(tokenizer) or (specs.get(expected) if expected else None)
    folder = False  # (whether the files are read from a folder as they are, not fetched)
    if tokenizer in specs:
        assert spec is not None  # specs.get(tokenizer), a spec
        directory, revision = _download(spec["repo"], revision or spec["revision"], _downloaded(spec))
    elif Path(tokenizer).is_dir():
        directory, folder = Path(tokenizer), True
    elif Path(tokenizer).exists():
        raise SpecError(f"tokenizer {tokenizer!r} is not a folder")
    elif is_hub_id(tokenizer):
        spec = next((s for s in specs.values() if s["repo"] == tokenizer), None)
        if not (revision or spec):
            raise SpecError(
                f"tokenizer {tokenizer!r} is not a local folder; as a Hub repo id it is not pinned in "
                f"{TOKENIZERS}, so it needs --tokenizer-revision"
            )
        if spec is not None:
            directory, revision = _download(tokenizer, revision or spec["revision"], _downloaded(spec))
        else:
            assert revision is not None  # checked above
            directory, revision = _download_any(tokenizer, revision, trust_remote_code)
    elif tokenizer.startswith((".", "/")):
        raise SpecError(f"tokenizer {tokenizer!r}: no such folder")
    else:
        raise SpecError(f"tokenizer {tokenizer!r} is not a spec name ({', '.join(specs)}), folder, or Hub repo id")

    family, names, files = _folder(directory, trust_remote_code)
    raise_cache_damage([directory / name for name in names], SpecError, [files[name]["sha256"] for name in names])
    same_family = {name: other for name, other in specs.items() if other.get("family", KIMI) == family}
    if spec is None:
        spec = next((s for s in same_family.values() if s["files"] == files), None)
    if spec is not None:
        mismatches = _differences(spec, files)
    else:  # name the spec that shares the most files, if any does
        differences = {name: _differences(other, files) for name, other in same_family.items()}
        closest = min(differences, key=lambda name: len(differences[name]), default=None)
        shared = closest is not None and any(same_family[closest]["files"].get(n) == files[n] for n in files)
        mismatches = ["the files match no pinned spec"] + (
            [f"closest is {closest}, from which " + "; ".join(differences[closest])]
            if shared
            else [f"{name} sha256 {files[name]['sha256']}" for name in names]
        )
    if mismatches and not allow_unpinned:
        pinned = f"the pinned spec {spec['name']}" if spec else f"every pinned spec in {TOKENIZERS}"
        raise SpecError(
            f"tokenizer files in {directory} differ from {pinned}: "
            + "; ".join(mismatches)
            + " (--allow-unpinned-tokenizer builds anyway and records it)"
        )
    if folder and revision is not None and (mismatches or spec is None or revision != spec["revision"]):
        pinned = f"; they are {spec['name']}'s, at {spec['revision']}" if spec and not mismatches else ""
        raise SpecError(
            f"--tokenizer-revision {revision}: the files in {directory} are read as they are, not fetched "
            f"at a revision{pinned}"
        )
    pin = _declarations_pin(spec) if spec else None
    declarations = (str(directory / MODEL_FILE), pin) if pin and (directory / MODEL_FILE).is_file() else None
    return ResolvedTokenizer(
        declarations=declarations,
        directory=directory,
        name=spec["name"] if spec else None,
        repo=spec["repo"] if spec else (None if folder else tokenizer),
        revision=(revision or spec["revision"]) if spec else revision,
        files=files,
        template_kwargs=spec["template_kwargs"] if spec else (TEMPLATE_KWARGS if family == KIMI else {}),
        loss_mask_type=spec["loss_mask_type"] if spec else None,
        pinned=not mismatches,
        mismatches=mismatches,
        family=family,
    )


def _folder(directory: Path, trust_remote_code: bool) -> tuple[str, list[str], dict[str, dict]]:
    """A tokenizer folder's family, the files it must hold, and their sizes and sha256s;
    ``SpecError`` naming those it lacks."""
    family = family_of(directory)
    names = folder_files(directory, family, trust_remote_code)
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise SpecError(f"tokenizer folder {directory} lacks {', '.join(missing)}")
    return family, names, file_hashes(directory, names)


def _declarations_pin(spec: dict[str, Any]) -> str | None:
    """The sha256 a spec pins the model's own tool-declaration encoder to, if it does: the
    file is then downloaded with the tokenizer, and builds compare their declarations with it."""
    entry = (spec.get("code_files") or {}).get(MODEL_FILE)
    return entry.get("sha256") if isinstance(entry, dict) and entry.get("check") else None


def _downloaded(spec: dict[str, Any]) -> tuple[str, ...]:
    """The files a spec's download fetches: its tokenizer files, and a pinned declaration encoder."""
    return (*spec["files"], *([MODEL_FILE] if _declarations_pin(spec) else []))


SPEC_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,95}")  # a spec's name: its file's, and a flag's value
_CACHE_REPO = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})$")


def pin_tokenizer(
    tokenizer: str,
    revision: str | None = None,
    repo: str | None = None,
    name: str | None = None,
    template_kwargs: dict | None = None,
    loss_mask_type: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """The tokenizer spec of a Hub repo at ``revision`` (downloaded; the spec pins the commit it
    resolved to) or of a folder (from the Hub repo ``repo`` at commit ``revision``; a Hugging
    Face cache snapshot folder names both): its family, each file's bytes and sha256, the template
    variables and the mask type (by default the family's). The encoder is loaded from the files
    with these template variables, so a spec that a build would refuse is refused here
    (``SpecError``; a template that reads the clock names the variable to pin)."""
    from .encode import EncoderConfig  # (the encoders import this module)

    if name is not None:
        _check_name(name, given=True)  # (before anything is downloaded or loaded)
    if repo is not None:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(repo)
            valid = "/" in repo
        except HFValidationError:
            valid = False
        if not valid:
            raise UsageError(f"--repo {repo!r} is not a Hub repo id (OWNER/NAME)")
    if Path(tokenizer).is_dir():
        directory = Path(tokenizer)
        cached = _CACHE_REPO.search(directory.resolve().as_posix())
        repo = repo or (f"{cached['owner']}/{cached['name']}" if cached else None)
        revision = revision or (cached["commit"] if cached else None)
        if not (repo and revision):
            raise UsageError(f"{tokenizer} is a folder: name the Hub repo and revision it is of (--repo, --revision)")
        from huggingface_hub.file_download import REGEX_COMMIT_HASH

        if not REGEX_COMMIT_HASH.fullmatch(revision):  # (a branch or tag moves: the spec would name other files)
            raise UsageError(f"--revision {revision}: a folder's files are pinned at a commit (40 hex digits)")
    elif is_hub_id(tokenizer):
        if not revision:
            raise UsageError(f"pinning the Hub repo {tokenizer} needs --revision")
        directory, revision = _download_any(tokenizer, revision, trust_remote_code)
        repo = repo or tokenizer
    else:
        raise UsageError(f"tokenizer {tokenizer!r} is neither a folder nor a Hub repo id")
    family, names, files = _folder(directory, trust_remote_code)
    # (a pin is trusted from here on: bytes the Hub does not hold are never pinned)
    raise_cache_damage([directory / name for name in names], SpecError, [files[name]["sha256"] for name in names])
    kwargs = (TEMPLATE_KWARGS if family == KIMI else {}) if template_kwargs is None else template_kwargs
    mask = loss_mask_type or (KIMI_MASK_TYPES if family == KIMI else HF_MASK_TYPES)[0]
    config = EncoderConfig(
        directory, {f: h["sha256"] for f, h in files.items()}, mask, kwargs, family, trust_remote_code
    )
    try:
        config.load()
    except (TokenizerError, TemplateMismatch, ValueError) as error:
        raise SpecError(f"{directory}: {error}") from None
    name = name or repo.rsplit("/", 1)[-1].lower()
    _check_name(name, given=False)
    return {
        "name": name,
        "family": family,
        "repo": repo,
        "revision": revision,
        "files": files,
        "template_kwargs": kwargs,
        "loss_mask_type": mask,
    }


def _check_name(name: str, given: bool) -> None:
    """``UsageError`` where ``name`` cannot name a spec (its file's name, and a flag's value)."""
    if not SPEC_NAME.fullmatch(name) or name.endswith(".json"):
        advice = "" if given else "; pass --name"
        raise UsageError(f"spec name {name!r} is not a name (lowercase letters, digits, '.', '-', '_'){advice}")


def write_tokenizer_spec(spec: dict, folder: Path | None = None) -> Path:
    """Write ``spec`` (``pin_tokenizer``) as ``NAME.json`` in ``folder``, by default
    ``fixed_sft/tokenizer_specs/``, where builds find it; an existing file is not replaced."""
    from .folder import writing_new  # (not in the encoders, which import this module)
    from .output import naming

    path = (folder or TOKENIZERS) / f"{spec['name']}.json"
    if os.path.lexists(path):
        raise UsageError(f"{path} exists; remove it first, or pass another --name")
    text = json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
    _check_tokenizer(path, json.loads(text))
    with writing_new(path) as part, naming(path):  # (complete, or not there)
        part.write_text(text, encoding="utf-8")
    return path
