"""Tests for the synthetic Tulu-3-SFT-like corpus generator."""

from __future__ import annotations

import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic as syn

N = 1500  # enough rows to see every content kind and the rarer features


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return syn.conversations(N, seed=0)


@pytest.fixture(scope="module")
def hard() -> list[str]:
    return syn.hard_strings(0)


def _all_text(rows: list[dict]) -> str:
    return "".join(m["content"] for r in rows for m in r["messages"])


def _read_parquet_rows(paths) -> list[dict]:
    out: list[dict] = []
    for p in paths:
        out.extend(pq.read_table(p).to_pylist())
    return out


# --------------------------------------------------------------------------
# determinism and the prefix property


def test_deterministic(rows):
    assert syn.conversations(N, seed=0) == rows
    assert syn.conversations(50, seed=7) == syn.conversations(50, seed=7)


def test_seed_changes_output(rows):
    assert syn.conversations(50, seed=1) != rows[:50]


def test_prefix_property(rows):
    assert syn.conversations(40, seed=0) == rows[:40]
    assert syn.conversations(0) == []
    assert syn.conversations(1, seed=3) == syn.conversations(25, seed=3)[:1]
    assert syn.conversation(0, 123) == rows[123]


def test_negative_n_rejected():
    with pytest.raises(ValueError):
        syn.conversations(-1)


def test_adversarial_deterministic_and_prefix():
    a = syn.conversations(200, seed=2, adversarial=True)
    assert a == syn.conversations(200, seed=2, adversarial=True)
    assert syn.conversations(60, seed=2, adversarial=True) == a[:60]
    plain = syn.conversations(200, seed=2)
    # same rows and structure; some contents are altered with hostile pieces
    assert [r["id"] for r in a] == [r["id"] for r in plain]
    assert [[m["role"] for m in r["messages"]] for r in a] == [[m["role"] for m in r["messages"]] for r in plain]
    assert a != plain
    text = _all_text(a)
    assert any(tok in text for tok in ("<|im_end|>", "<think>", "[EOS]", "<|im_", "<|"))


# --------------------------------------------------------------------------
# schema and structure


def test_schema_and_ids(rows):
    assert len(rows) == N
    assert len({r["id"] for r in rows}) == N
    for i, r in enumerate(rows):
        assert set(r) == {"id", "messages", "source"}
        assert r["id"] == f"synthetic_{i}"
        assert isinstance(r["source"], str) and r["source"].startswith("synthetic/")
        assert r["source"].split("/", 1)[1] in syn.KINDS
        for m in r["messages"]:
            assert set(m) == {"role", "content"}
            assert isinstance(m["role"], str) and isinstance(m["content"], str)


def test_roles_alternate(rows):
    ends_assistant = 0
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        if roles and roles[0] == "system":
            roles = roles[1:]
        assert roles, r["id"]
        assert "system" not in roles
        for j, role in enumerate(roles):
            assert role == ("user" if j % 2 == 0 else "assistant"), r["id"]
        n_user = roles.count("user")
        assert 1 <= n_user <= 12
        ends_assistant += roles[-1] == "assistant"
    assert ends_assistant >= 0.9 * len(rows)
    assert ends_assistant < len(rows)  # a few end with "user"


def test_content_mix(rows):
    text = _all_text(rows)
    sources = {r["source"] for r in rows}
    assert sources == {f"synthetic/{k}" for k in syn.KINDS}

    def has(lo: int, hi: int) -> bool:
        return any(lo <= ord(c) <= hi for c in text)

    assert "```python\n" in text and "```javascript\n" in text
    assert "\n    " in text  # indented code
    assert "\\frac{" in text and "\\boxed{" in text
    assert has(0x4E00, 0x9FFF)  # Han
    assert len({c for c in text if 0x4E00 <= ord(c) <= 0x9FFF}) > 2000
    assert has(0x3041, 0x3096) and has(0x30A1, 0x30FA)  # kana
    assert has(0xAC00, 0xD7A3)  # Hangul
    assert has(0x0400, 0x04FF)  # Cyrillic
    assert has(0x0600, 0x06FF)  # Arabic
    assert has(0x0900, 0x097F)  # Devanagari
    assert any(c in text for c in "äöüßéèçœ")
    assert has(0x1F300, 0x1FAFF)  # astral emoji
    assert "\u200d" in text  # ZWJ sequences
    assert has(0x0300, 0x036F)  # combining marks
    assert "\r\n" in text

    msgs = [m for r in rows for m in r["messages"]]
    assert any(m["role"] == "system" for m in msgs)
    assert any(m["role"] == "assistant" and m["content"] == "" for m in msgs)
    longest = max(len(m["content"]) for m in msgs)
    assert 20_000 <= longest <= 70_000
    turns = {sum(m["role"] == "user" for m in r["messages"]) for r in rows}
    assert 1 in turns and max(turns) >= 8


def test_text_is_valid_unicode(rows, hard):
    for s in [m["content"] for r in rows for m in r["messages"]] + hard:
        s.encode("utf-8")  # raises on lone surrogates
        assert not any(unicodedata.category(c) == "Cs" for c in s[:2000])


# --------------------------------------------------------------------------
# hard strings


def test_hard_strings(hard):
    assert syn.hard_strings(0) == hard
    assert syn.hard_strings(1) != hard
    joined = "\x01".join(hard)
    for tok in (
        "<|im_end|>",
        "<|im_user|>",
        "[EOS]",
        "<think>",
        "</think>",
        "<|reserved_token_163700|>",
        "<|im_",
        "\r\n",
        "\t",
        "\u00a0",
        "\u3000",
        "\u200d",
    ):
        assert tok in hard or tok in joined, tok
    assert "<|im_" in hard  # a half token on its own
    assert any(s.count(" ") >= 30_000 and " " * 30_000 in s for s in hard)
    assert any(len(s) >= 30_000 and not any(c.isspace() for c in s) for s in hard)
    assert any(len(s) > 400_000 for s in hard)
    assert any(ord(c) > 0xFFFF for c in joined)
    assert sum(map(len, hard)) < 2_000_000  # cheap


def test_hard_conversations(hard):
    hc = syn.hard_conversations(0)
    assert len(hc) == 2 * len(hard)
    assert len({r["id"] for r in hc}) == len(hc)
    assert [r["messages"][1]["content"] for r in hc[0::2]] == hard
    assert [r["messages"][1]["content"] for r in hc[1::2]] == hard


# --------------------------------------------------------------------------
# writers


def test_parquet_single_file_round_trip(rows, tmp_path):
    target = tmp_path / "sub" / "data.parquet"
    paths = syn.write_parquet(rows, target)
    assert paths == [target] and target.is_file()
    table = pq.read_table(target)
    assert table.schema.names == ["id", "messages", "source"]
    mtype = table.schema.field("messages").type
    assert pa.types.is_list(mtype)
    assert [f.name for f in mtype.value_type] == ["content", "role"]
    assert all(pa.types.is_string(f.type) for f in mtype.value_type)
    assert table.schema.equals(syn.TULU_SCHEMA)
    assert table.to_pylist() == rows


def test_parquet_sharded_round_trip(rows, tmp_path):
    paths = syn.write_parquet(rows, tmp_path / "shards", rows_per_file=400)
    n_files = -(-N // 400)
    assert [p.name for p in paths] == [f"train-{k:05d}-of-{n_files:05d}.parquet" for k in range(n_files)]
    assert all(p.parent == tmp_path / "shards" for p in paths)
    assert [pq.read_metadata(p).num_rows for p in paths] == [min(400, N - 400 * k) for k in range(n_files)]
    assert _read_parquet_rows(sorted(paths)) == rows


def test_parquet_edge_cases(tmp_path):
    paths = syn.write_parquet([], tmp_path / "empty", rows_per_file=10)
    assert [p.name for p in paths] == ["train-00000-of-00001.parquet"]
    assert pq.read_table(paths[0]).num_rows == 0
    with pytest.raises(ValueError):
        syn.write_parquet([], tmp_path / "bad", rows_per_file=0)


def test_parquet_hard_round_trip(tmp_path):
    hc = syn.hard_conversations(0) + syn.conversations(100, seed=4, adversarial=True)
    (p,) = syn.write_parquet(hc, tmp_path / "hard.parquet")
    assert pq.read_table(p).to_pylist() == hc


def test_jsonl_round_trip(rows, tmp_path):
    p = syn.write_jsonl(rows, tmp_path / "x" / "rows.jsonl")
    assert p == tmp_path / "x" / "rows.jsonl"
    with open(p, encoding="utf-8") as f:
        parsed = [json.loads(line) for line in f]
    assert parsed == rows
    assert syn.read_jsonl(p) == rows


def test_jsonl_hard_round_trip(tmp_path):
    hc = syn.hard_conversations(0)
    p = syn.write_jsonl(hc, tmp_path / "hard.jsonl")
    data = p.read_bytes()
    # one line per row, even with U+2028 / U+0085 / "\r" inside contents
    assert data.count(b"\n") == len(hc)
    assert len(data.decode("utf-8").splitlines()) == len(hc)
    assert syn.read_jsonl(p) == hc
