"""Text -> token ids, exactly as the Kimi tokenizer encodes text.

Rules (the model's own tokenizer, restated):

1. The text is split on the named added tokens of ``tokenizer_config.json``
   (``added_tokens_decoder``); each becomes its id.
2. Every other piece is cut into 400,000-character windows, and each window is cut
   just before any character that would make a run of consecutive whitespace, or of
   consecutive non-whitespace, characters (``str.isspace``) longer than 25,000; the
   run restarts at 1 after a cut.
3. Each part is BPE-encoded by tiktoken with every special token allowed, so a
   ``<|reserved_token_N|>`` string in the text becomes id N.

Special ids follow the ranks: ``num_ranks .. num_ranks + 255``, named from
``added_tokens_decoder`` where listed, else ``<|reserved_token_{id}|>``.

The BPE of rule 3 (``BPES``): tiktoken, the reference, or gigatoken, a faster exact
BPE over the same ranks, pattern (its ``kimi`` pretokenizer) and special tokens, used
behind a parity check. gigatoken finds every special-token string, as tiktoken does
with all of them allowed, and refuses a text with a surrogate, which is mended first
as tiktoken's ``encode`` mends it. A tokenizer with gigatoken has a tiktoken twin
(``reference``) and refuses to load unless both give the same ids on
``PARITY_TEXTS``: the twin's ids, or those kept in the token store's folder for the same
files, code and tiktoken version, checked by their sha256 (then the twin, whose ranks and
encoding take 0.25 s and 60 MB, is made only when asked for; kept ids gigatoken does not
give are not trusted: the twin's are taken, and kept, instead). The chat encoder's probes
and the build's sampled template check compare its ids with the reference's as well.
gigatoken keeps every pretoken it has seen in a cache, which grows with the distinct
words of the source: once this process's resident memory has grown by
``FAST_BPE_CACHE_BYTES`` since it loaded, a fresh gigatoken of the same file (checked by
its sha256, and on ``PARITY_TEXTS`` again) replaces it.

``load_kimi`` gives the tokenizer of a folder once per process for the same files: it is
keyed by the folder's path and the sha256 of each of ``FILES``, hashed anew at each call,
so a file changed at the same path is read again; the last ``LOADED_TOKENIZERS`` are kept.
A BPE file's ranks and tiktoken encoding are likewise made once per process for the same
bytes (its sha256), whatever folder holds it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Set
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from .fields import read_json_object
from .hashes import read_checked_json, sha256_file, write_checked_json

PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
NUM_SPECIAL = 256
WINDOW_CHARS = 400_000
MAX_RUN = 25_000
FILES = ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja")
_NONE: frozenset[str] = frozenset()
_EMPTY = np.zeros(0, np.uint32)
TEMPLATE_KWARGS = {"thinking": True, "preserve_thinking": False}  # what the model's apply_chat_template passes
BPES = ("gigatoken", "tiktoken")  # the BPE of rule 3: the fast one, and the reference
FAST_BPE_OFF = "build with --bpe tiktoken"  # what a parity failure suggests
# Texts on which gigatoken must give tiktoken's ids before it is used: each alternative of
# PATTERN, the case, script, digit, mark and whitespace classes it splits on, contractions,
# special-token text (whole, cut, adjoining), surrogates, and a text past MAX_RUN (cut in parts).
PARITY_TEXTS = (
    "",
    "Hello, World! It's we'll THEY'RE don't I'M O'Neil's x'S",
    "汉字和English混合，日本語のテキストとカタカナ、한국어 문장입니다.",
    "1234567 3.14159 -0.5e10 ٣٤٥ ⅷ ²³ 0x1F 1,000,000",
    "  lead\n\n\ttabs\r\n\r\n  trail   \u00a0nbsp\u3000wide\u2028sep\x0b\x0c\x1c end \n ",
    "café naïve e\u0301\u0302 ǅungla ǈ ﬁ Ⅻ ʰʲ Ωmega ΣΑΣ İstanbul ß",
    "def f(x):\n    return x**2 // 3  # comment\n\n\n}}]);\n\t\t",
    "<|im_end|><|im_user|>user<|im_middle|>a<|reserved_token_163700|>b<|im_end <|im_end|[EOS]<think>",
    "😀👍🏽 👨\u200d👩\u200d👧 !!! ...?! «quote» —dash— ‘single’",
    "a\ud800b\udfff \ud83d\ude00 \udbff",
    "word " * 6000 + "x" * 26_000 + " <|im_end|>" + "\n" * 30_000 + "字" * 10,
)
FAST_BPE_CACHE_BYTES = 128 << 20  # resident memory a gigatoken's pretoken cache may add before it is renewed
FAST_BPE_CHECK_CHARS = 4 << 20  # characters gigatoken encodes between two looks at the resident memory
PARITY_VERSION = 2  # of the kept parity file (``_parity_path``)
LOADED_TOKENIZERS = 4  # the tokenizers (folder, files and BPE) ``load_kimi`` keeps loaded
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@functools.cache
def _whitespace_codepoints() -> np.ndarray:
    """Code points where ``str.isspace`` holds (``re``'s ``\\s`` is the same predicate)."""
    everything = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return np.array([m.start() for m in re.finditer(r"\s", everything)], dtype=np.uint32)


def split_runs(text: str) -> list[str]:
    """Cut ``text`` before each character that would extend a whitespace or
    non-whitespace run past ``MAX_RUN`` characters (the run then restarts at 1)."""
    if len(text) <= MAX_RUN:
        return [text]
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    space = np.isin(codes, _whitespace_codepoints())
    change = np.flatnonzero(space[1:] != space[:-1]) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [len(text)]))
    cuts = [
        cut
        for k in np.flatnonzero(ends - starts > MAX_RUN)
        for cut in range(int(starts[k]) + MAX_RUN, int(ends[k]), MAX_RUN)
    ]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


class TokenizerError(ValueError):
    """Tokenizer files these rules cannot be applied to."""


def fast_bpe_installed() -> bool:
    """Whether gigatoken can be imported."""
    return importlib.util.find_spec("gigatoken") is not None


def default_bpe() -> str:
    """The BPE a build uses unless told: gigatoken where it is installed, else tiktoken."""
    return "gigatoken" if fast_bpe_installed() else "tiktoken"


def bpe_version(bpe: str) -> str:
    """``bpe`` and its installed version, as a manifest records it: ``gigatoken 0.10.0``."""
    return f"{bpe} {importlib.metadata.version(bpe)}"


def _resident_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none: gigatoken is then never renewed)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _mended(text: str) -> str:
    """``text`` with each surrogate that pairs with the next joined to it and each other
    replaced by U+FFFD, as tiktoken's ``encode`` mends a text it cannot encode as UTF-8."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _load_gigatoken(model: Path, specials: dict[str, int]) -> Any:
    """gigatoken's BPE of the ranks in ``model`` with the Kimi pretokenizer and ``specials``:
    its ``Tokenizer``, whose ``encode`` gives uint32 ids and finds every special token. (Its
    ``as_tiktoken()`` adapter gives lists, and refuses a special-token string that is
    neither allowed nor disallowed rather than encode it as text.)"""
    try:
        import gigatoken
    except ImportError:
        raise TokenizerError("--bpe gigatoken: gigatoken is not installed (pip install gigatoken)") from None
    try:
        return gigatoken.Tokenizer.from_tiktoken(str(model), pretokenizer="kimi", special_tokens=specials)
    except Exception as error:  # whatever the young library raises on these files
        raise TokenizerError(
            f"{model}: gigatoken cannot load it ({type(error).__name__}: {error}); {FAST_BPE_OFF}"
        ) from None


_parsing = threading.Lock()
_parsed: OrderedDict[tuple, Any] = OrderedDict()  # the last few BPE files' ranks and encodings


def _kept(key: tuple, make: Any) -> Any:
    """``make()``, kept for ``key`` among the last ``2 * LOADED_TOKENIZERS`` made."""
    with _parsing:
        found = _parsed.get(key)
        if found is None:
            found = _parsed[key] = make()
        _parsed.move_to_end(key)
        while len(_parsed) > 2 * LOADED_TOKENIZERS:
            _parsed.popitem(last=False)
        return found


def _ranks(model: Path, sha256: str) -> dict[bytes, int]:
    """The ranks of the tiktoken BPE file ``model`` whose bytes have ``sha256`` (tiktoken
    checks them as it reads), read once per process for the same bytes."""
    return _kept(("ranks", sha256), lambda: load_tiktoken_bpe(str(model), expected_hash=sha256))


def _encoding(name: str, sha256: str, ranks: dict[bytes, int], specials: dict[str, int]) -> tiktoken.Encoding:
    """tiktoken's ``Encoding`` of ``PATTERN``, ``ranks`` (those of the BPE file of ``sha256``)
    and ``specials``, made once per process for the same."""
    key = ("encoding", name, sha256, tuple(specials.items()))
    return _kept(key, lambda: tiktoken.Encoding(name, pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials))


def _parity_path(kept: Path, model_sha256: str, named: dict[int, str]) -> Path:
    """Where the reference's ids of ``PARITY_TEXTS`` are kept in the folder ``kept``: named by
    the sha256 of all they depend on (the BPE file's bytes, the added tokens, this module's
    code, which holds the rules, and tiktoken's version)."""
    inputs = [PARITY_VERSION, tiktoken.__version__, _code_sha256(), model_sha256, sorted(named.items())]
    return kept / f"parity-{hashlib.sha256(json.dumps(inputs).encode()).hexdigest()}.json"


@functools.cache
def _code_sha256() -> str:
    """The sha256 of this module's source (its rules, ``PATTERN`` and ``PARITY_TEXTS``)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _read_parity(path: Path) -> tuple[int, list[np.ndarray]] | None:
    """The rank count and reference ids kept at ``path`` (``KimiTokenizer._check_parity``);
    ``None`` where there are none, or they are damaged."""
    body = read_checked_json(path)
    try:
        if not isinstance(body, dict) or len(body["ids"]) != len(PARITY_TEXTS):
            return None
        return int(body["ranks"]), [np.array(ids, np.uint32) for ids in body["ids"]]
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _overlap(names: Iterable[str]) -> tuple[str, str] | None:
    """Two names one of which holds the other, or whose ends overlap (a proper suffix
    of one is a proper prefix of the other; both may be the same name, as ``<|x<|``);
    ``None`` when occurrences of names in any text never overlap, so any scan finds
    the same ones."""
    names = list(names)
    prefixes = {name[:k]: name for name in names for k in range(1, len(name))}
    for name in names:
        for other in names:
            if other != name and other in name:
                return other, name
        for k in range(1, len(name)):
            if name[k:] in prefixes:
                return name, prefixes[name[k:]]
    return None


def _config(directory: Path) -> dict:
    return read_json_object(Path(directory) / "tokenizer_config.json", TokenizerError)


def _named(config: dict) -> dict[int, str]:
    """Named added tokens by id, from ``added_tokens_decoder``: each name a non-empty
    string that no other id has."""
    try:
        named = {int(i): entry["content"] for i, entry in config["added_tokens_decoder"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise TokenizerError("tokenizer_config.json: 'added_tokens_decoder' is missing or malformed") from None
    ids: dict[str, int] = {}
    for i, name in sorted(named.items()):
        if not (isinstance(name, str) and name):
            raise TokenizerError(f"tokenizer_config.json: added token {i} is named {name!r}, not a non-empty string")
        if name in ids:
            raise TokenizerError(f"tokenizer_config.json: added tokens {ids[name]} and {i} are both named {name!r}")
        ids[name] = i
    return named


def _eos_id(config: dict, added: dict[str, int]) -> int:
    """The id in ``added`` (text -> id) of ``config["eos_token"]`` (default ``[EOS]``): an
    added token's text, or an added-token object holding it as ``content``."""
    name = config.get("eos_token", "[EOS]")
    if isinstance(name, dict):
        name = name.get("content")
    if not isinstance(name, str) or name not in added:
        raise TokenizerError(f"tokenizer_config.json: eos_token {name!r} is not an added token")
    return added[name]


def _special_tokens(config: dict) -> dict[str, str]:
    """``bos_token``, ``eos_token`` ... as text, where ``tokenizer_config.json`` sets them
    (transformers passes these to the chat template)."""
    tokens = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def eos_token(directory: str | Path) -> str:
    """The text of the eos token (``[EOS]``), read from ``tokenizer_config.json`` alone."""
    config = _config(Path(directory))
    ids = {text: i for i, text in _named(config).items()}
    return next(text for text, i in ids.items() if i == _eos_id(config, ids))


def eos_id(directory: str | Path) -> int:
    """The id of the eos token (``[EOS]``), read from ``tokenizer_config.json`` alone."""
    config = _config(Path(directory))
    return _eos_id(config, {text: i for i, text in _named(config).items()})


class KimiTokenizer:
    """The Kimi tokenizer read from a folder holding ``FILES``: the BPE ranks, the added
    tokens and the chat template that ``ChatEncoder`` renders. ``bpe`` (one of ``BPES``;
    default ``default_bpe()``) encodes the parts of rule 3; ``reference`` is the same
    tokenizer with tiktoken (itself, when ``bpe`` is tiktoken)."""

    def __init__(self, directory: str | Path, bpe: str | None = None, kept: Path | None = None):
        self.directory = Path(directory)
        self.bpe = bpe or default_bpe()
        if self.bpe not in BPES:
            raise ValueError(f"unknown BPE {self.bpe!r} (known: {', '.join(BPES)})")
        model = self.directory / "tiktoken.model"
        try:
            # tiktoken caches a file's contents by its path: the hash makes it re-read a changed file
            self._model_sha256 = sha256_file(model)
        except OSError as error:
            raise TokenizerError(f"{model}: cannot read it ({error})") from None
        config = _config(self.directory)
        named = _named(config)
        self._parity_file = _parity_path(kept, self._model_sha256, named) if kept and self.bpe == "gigatoken" else None
        parity = _read_parity(self._parity_file) if self._parity_file else None
        if parity is not None and not all(parity[0] <= i < parity[0] + NUM_SPECIAL for i in named):
            parity = None  # (a rank count these added tokens refute: tiktoken reads the file)
        self._parity_ids = None if parity is None else parity[1]
        self._first = len(self._load_ranks()) if parity is None else parity[0]
        first = self._first
        specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(first, first + NUM_SPECIAL)}
        self.added: dict[str, int] = {text: i for i, text in named.items()}
        if not all(first <= i < first + NUM_SPECIAL for i in named):
            raise TokenizerError(f"{self.directory}: an added token's id is outside {first}..{first + NUM_SPECIAL - 1}")
        clash = _overlap(specials)
        if clash:
            raise TokenizerError(f"{self.directory}: special tokens {clash[0]!r} and {clash[1]!r} overlap")
        self._added_split = re.compile("|".join(map(re.escape, self.added)))
        self._special = re.compile("|".join(map(re.escape, specials)))
        self._special_firsts = sorted({text[0] for text in specials})
        self.eos_id = _eos_id(config, self.added)
        self.special_tokens = _special_tokens(config)
        try:
            self.chat_template = (self.directory / "chat_template.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenizerError(f"{self.directory / 'chat_template.jinja'}: cannot read it ({error})") from None
        self._fast: Any = None
        self._fast_chars = self._fast_base = 0  # characters since the last look at memory; memory once loaded
        self.fast_loads = 0  # how many times the fast BPE has been loaded (renewed, after the first)
        self._specials = specials
        self._encoding: tiktoken.Encoding | None = None
        self._reference: KimiTokenizer | None = None
        if self.bpe == "tiktoken":
            self._reference = self
            self.encoding  # noqa: B018 (made now: a file tiktoken cannot read fails as it loads)
        else:
            self._load_fast()

    def _load_ranks(self) -> dict[bytes, int]:
        model = self.directory / "tiktoken.model"
        try:
            return _ranks(model, self._model_sha256)
        except Exception as error:  # a damaged file fails in base64, int or split
            raise TokenizerError(f"{model}: not a tiktoken BPE file ({type(error).__name__}: {error})") from None

    @property
    def encoding(self) -> tiktoken.Encoding:
        """tiktoken's ``Encoding`` of these files, made when first asked for (once per process
        for the same bytes): a gigatoken tokenizer whose parity is kept never makes it unless asked."""
        if self._encoding is None:
            ranks = self._load_ranks()
            if len(ranks) != self._first:
                model = self.directory / "tiktoken.model"
                raise TokenizerError(f"{model}: holds {len(ranks)} ranks, not the {self._first} kept")
            self._encoding = _encoding(f"kimi:{self.directory.name}", self._model_sha256, ranks, self._specials)
        return self._encoding

    @property
    def reference(self) -> KimiTokenizer:
        """The same tokenizer with tiktoken: this one, or its twin (made when first asked for,
        sharing the names and the template)."""
        if self._reference is None:
            twin = copy.copy(self)
            twin.bpe, twin._fast, twin._reference = "tiktoken", None, twin
            self._reference = twin
        return self._reference

    def _fast_twin(self) -> KimiTokenizer:
        """This tiktoken tokenizer's gigatoken twin, sharing its ranks, names and template
        (and this one as its ``reference``), checked on ``PARITY_TEXTS``."""
        assert self.reference is self, "a twin of the reference"
        fast = copy.copy(self)
        fast.bpe, fast._reference = "gigatoken", self
        fast._load_fast()
        return fast

    def _load_fast(self) -> None:
        """Load gigatoken, check its ids against the reference's, and note the memory then."""
        self._fast = None  # (a previous one's cache is freed first)
        self._fast = _load_gigatoken(self.directory / "tiktoken.model", self._specials)
        self.fast_loads += 1
        self._fast_chars = -(1 << 62)  # (the parity texts do not count)
        self._check_parity()
        self._fast_chars, self._fast_base = 0, _resident_bytes()

    def _renew_fast_if_grown(self, chars: int) -> None:
        """After every ``FAST_BPE_CHECK_CHARS`` characters, renew gigatoken where this
        process's memory has grown by ``FAST_BPE_CACHE_BYTES`` since it loaded (its cache);
        ``TokenizerError`` where its file has changed since this tokenizer read it."""
        self._fast_chars += chars
        if self._fast_chars < FAST_BPE_CHECK_CHARS:
            return
        self._fast_chars = 0
        resident = _resident_bytes()
        if not resident or resident - self._fast_base < FAST_BPE_CACHE_BYTES:
            return
        model = self.directory / "tiktoken.model"
        if sha256_file(model) != self._model_sha256:
            raise TokenizerError(f"{model} changed since it was loaded; run the build again")
        self._load_fast()

    def _check_parity(self) -> None:
        """Raise ``TokenizerError`` unless the fast BPE gives the reference's ids on
        ``PARITY_TEXTS``: those kept for these files (``load_kimi``'s ``kept``), or where
        there are none, or they differ, tiktoken's own, which are then kept there."""
        if self._parity_ids is not None and self._first_difference(self._parity_ids) is None:
            return
        expected = [self.reference.encode_to_numpy(text) for text in PARITY_TEXTS]
        text = self._first_difference(expected)
        if text is not None:
            raise TokenizerError(
                f"{self.directory}: gigatoken's ids differ from tiktoken's on {text[:40]!r}; {FAST_BPE_OFF}"
            )
        self._parity_ids = expected
        if self._parity_file is not None:
            write_checked_json(self._parity_file, {"ranks": self._first, "ids": [ids.tolist() for ids in expected]})

    def _first_difference(self, expected: list[np.ndarray]) -> str | None:
        """The first of ``PARITY_TEXTS`` whose ids differ from ``expected``, if any."""
        for text, ids in zip(PARITY_TEXTS, expected, strict=True):
            if not np.array_equal(self.encode_to_numpy(text), ids):
                return text
        return None

    def differs_from_reference(self, text: str) -> bool:
        """Whether the ids of ``text`` differ from the reference's (never, for tiktoken),
        compared a piece at a time."""
        if self.reference is self:
            return False
        mine, theirs = self.encode_pieces(text), self.reference.encode_pieces(text)
        return any(not np.array_equal(a, b) for a, b in itertools.zip_longest(mine, theirs, fillvalue=_EMPTY))

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (rules 1-3 of the module docstring)."""
        return self.encode_to_numpy(text).tolist()

    def encode_to_numpy(self, text: str) -> np.ndarray:
        """``encode`` as a read-only uint32 array."""
        if len(text) <= MAX_RUN:
            return self._encode_short(text)
        ids = np.concatenate(list(self.encode_pieces(text)))
        ids.flags.writeable = False
        return ids

    def encode_pieces(self, text: str) -> Iterator[np.ndarray]:
        """``encode`` as consecutive uint32 arrays, one per part that rules 1-3 cut (at
        most a window each) and one per named added token: their concatenation is the
        text's ids, so a caller that compares or copies them one at a time never holds the
        ids of a long text as Python integers, nor all at once."""
        if len(text) <= MAX_RUN:
            yield self._encode_short(text)
            return
        # rules 1-3 step by step: the named added tokens, and between them the windows' runs
        start = 0
        for match in self._added_split.finditer(text):
            yield from self._encode_plain(text, start, match.start())
            yield np.array([self.added[match.group()]], dtype=np.uint32)
            start = match.end()
        yield from self._encode_plain(text, start, len(text))

    def _encode_short(self, text: str) -> np.ndarray:
        """The ids of a text of at most ``MAX_RUN`` characters, which has no window or run
        cut, so rules 1-3 are one tiktoken call that allows the special-token strings the
        text holds (tiktoken cuts at each, as the added-token split does: no name overlaps
        another, which loading checks)."""
        if self._fast is not None:  # (which finds every special token, whatever ``allowed`` says)
            return self._encode_part(text, "all")
        allowed = _NONE
        if any(first in text for first in self._special_firsts):
            allowed = frozenset(self._special.findall(text))
        return self._encode_part(text, allowed)

    def _encode_plain(self, text: str, start: int, end: int) -> Iterator[np.ndarray]:
        """The ids of ``text[start:end]``, a piece holding no named added token, cut into
        windows and runs; the piece is sliced a window at a time, never copied whole."""
        for window in range(start, end, WINDOW_CHARS):
            for part in split_runs(text[window : min(window + WINDOW_CHARS, end)]):
                yield self._encode_part(part, "all")

    def _encode_part(self, part: str, allowed: Set[str] | Literal["all"]) -> np.ndarray:
        """tiktoken's ids of one part, as its ``encode`` gives them: a part with a
        surrogate is first mended as ``encode`` mends it. With gigatoken, its ids: it
        allows every special token, which ``allowed`` (those the part holds, or all) is
        the same as, since no name overlaps another."""
        if self._fast is not None:
            try:
                ids = self._fast.encode(part)
            except TypeError:  # a surrogate, which gigatoken refuses
                ids = self._fast.encode(_mended(part))
            ids.flags.writeable = False
            self._renew_fast_if_grown(len(part))
            return ids
        try:
            return self.encoding.encode_to_numpy(part, allowed_special=allowed, disallowed_special=())
        except UnicodeEncodeError:  # surrogates: tiktoken's ``encode`` rule, which the model's tokenizer follows
            return self.encoding.encode_to_numpy(_mended(part), allowed_special=allowed, disallowed_special=())


_loading = threading.Lock()
_loaded: OrderedDict[tuple, KimiTokenizer] = OrderedDict()


def _identity(directory: Path) -> tuple:
    """What decides a folder's tokenizer: its path as given and from the root, and the
    sha256 of each of ``FILES`` (``None`` for one that cannot be read)."""
    digests: list[str | None] = []
    for name in FILES:
        try:
            digests.append(sha256_file(directory / name))
        except OSError:
            digests.append(None)
    return (str(directory), os.path.abspath(directory), *digests)


def load_kimi(directory: str | Path, bpe: str | None = None, kept: Path | None = None) -> KimiTokenizer:
    """``KimiTokenizer(directory, bpe, kept)``, loaded once per process for the same files (module
    docstring) and shared by its callers: a gigatoken tokenizer of files loaded with tiktoken
    first has that one as its ``reference``, and one whose twin was made as it loaded gives
    that twin to later callers for tiktoken. One loaded while its files changed is not kept.
    ``kept``: a folder where the reference's ids of ``PARITY_TEXTS`` are kept, so that
    gigatoken is checked against them without loading tiktoken's ranks (made only where a
    caller asks for the reference)."""
    directory, bpe = Path(directory), bpe or default_bpe()
    with _loading:
        identity = _identity(directory)
        found = _loaded.get((identity, bpe))
        if found is None:
            reference = _loaded.get((identity, "tiktoken")) if bpe == "gigatoken" else None
            found = reference._fast_twin() if reference is not None else KimiTokenizer(directory, bpe, kept)
            if _identity(directory) != identity or found._model_sha256 != identity[2]:
                return found  # (read while a file changed: for this caller alone)
            _loaded[identity, bpe] = found
            if found._reference is not None:
                _loaded[identity, "tiktoken"] = found._reference
        _loaded.move_to_end((identity, bpe))
        while len(_loaded) > LOADED_TOKENIZERS:
            _loaded.popitem(last=False)
        return found
