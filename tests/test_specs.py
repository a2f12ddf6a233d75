"""Named builds and pinned tokenizers: specs resolve, downloads are pinned, flags override."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import synthetic
from conftest import cache_link

from fixed_sft.cli import main
from fixed_sft.specs import DEFAULT_BUILD, SpecError, build_spec, resolve_tokenizer, tokenizer_spec


@pytest.fixture
def fake_hub(kimi_dir, monkeypatch):
    calls = []

    def hf_hub_download(repo_id, filename, revision=None, **kwargs):
        calls.append((repo_id, filename, revision))
        return str(Path(kimi_dir) / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", hf_hub_download)
    return calls


def test_spec_name_downloads_at_the_pinned_revision(fake_hub):
    resolved = resolve_tokenizer("kimi-k2.6")
    spec = tokenizer_spec("kimi-k2.6")
    assert {(repo, rev) for repo, _, rev in fake_hub} == {(spec["repo"], spec["revision"])}
    assert sorted(name for _, name, _ in fake_hub) == sorted(spec["files"])
    assert resolved.pinned and resolved.revision == spec["revision"]


def test_repo_id_is_checked_against_its_spec(fake_hub):
    resolved = resolve_tokenizer("moonshotai/Kimi-K2.6")
    assert resolved.name == "kimi-k2.6" and resolved.pinned
    assert fake_hub[0][2] == tokenizer_spec("kimi-k2.6")["revision"]


def test_unknown_repo_needs_a_revision():
    with pytest.raises(SpecError, match="--tokenizer-revision"):
        resolve_tokenizer("someone/else")


def test_folder_is_named_by_its_matching_spec(kimi_dir):
    resolved = resolve_tokenizer(str(kimi_dir))
    assert (resolved.name, resolved.repo) == ("kimi-k2.6", "moonshotai/Kimi-K2.6")
    assert resolved.files["tiktoken.model"]["bytes"] == 2_795_286


def test_a_folder_takes_no_other_revision_than_its_specs(kimi_dir):
    """A folder's files are hashed, not fetched: a revision other than its spec's would be
    recorded as where they came from, so it is refused."""
    pinned = tokenizer_spec("kimi-k2.6")["revision"]
    assert resolve_tokenizer(str(kimi_dir), pinned).revision == pinned
    with pytest.raises(SpecError, match=f"--tokenizer-revision abc: .* they are kimi-k2.6's, at {pinned}"):
        resolve_tokenizer(str(kimi_dir), "abc")


def test_folder_missing_a_file(kimi_dir, tmp_path):
    (tmp_path / "tiktoken.model").write_bytes((Path(kimi_dir) / "tiktoken.model").read_bytes())
    with pytest.raises(SpecError, match="lacks tokenizer_config.json"):
        resolve_tokenizer(str(tmp_path))


def test_default_build_spec_records_the_recipe():
    spec = build_spec(DEFAULT_BUILD)
    assert (spec["rows"], spec["row_tokens"], spec["seed"]) == (6400, 8192, 42)
    assert spec["source_revision"] == "b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"
    assert spec["published"]["parquet_bytes"] == 91_955_447


def test_named_build_with_overrides_reports_published_values(kimi_dir, tmp_path, capsys):
    """NAME picks the spec, flags override it, and the build says honestly whether it
    matches the values the recipe published."""
    synthetic.write_jsonl(synthetic.conversations(100, seed=8), tmp_path / "rows.jsonl")
    code = main(
        [
            "build",
            DEFAULT_BUILD,
            "--source",
            str(tmp_path / "rows.jsonl"),
            "--tokenizer",
            str(kimi_dir),
            "--rows",
            "2",
            "--row-tokens",
            "256",
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "1",
            "--quiet",
        ]
    )
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["name"] == DEFAULT_BUILD
    assert manifest["params"]["seed"] == 42 and manifest["params"]["rows"] == 2
    assert manifest["source"]["revision"] is None  # a local source does not inherit the Hub revision
    out = capsys.readouterr().out
    assert f"not the same as the values published for {DEFAULT_BUILD}" in out
    assert "rows_sha256: differs" in out


def test_console_script_is_declared():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["generate-fixed-sft"] == "fixed_sft.cli:run"


def test_other_repo_downloads_at_its_own_revision(fake_hub):
    resolved = resolve_tokenizer("someorg/other-model", revision="abc", allow_unpinned=True)
    assert {(repo, rev) for repo, _, rev in fake_hub} == {("someorg/other-model", "abc")}
    assert resolved.name == "kimi-k2.6"  # the files are byte-identical to the pinned spec


def test_an_install_without_its_specs_says_so(monkeypatch, tmp_path):
    import fixed_sft.specs as specs

    monkeypatch.setattr(specs, "BUILDS", tmp_path / "builds")
    with pytest.raises(SpecError, match="the package is incomplete; reinstall fixed-sft"):
        build_spec(DEFAULT_BUILD)


def test_the_specs_are_package_data():
    """pyproject's package data names every spec file, so a wheel (``pip install .``)
    carries them; .ci/run also reads them from such an install."""
    import fnmatch
    import tomllib

    import fixed_sft.specs as specs

    globs = tomllib.loads((Path(specs.__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["fixed_sft"]
    files = [
        p.relative_to(Path(specs.__file__).parent).as_posix()
        for p in (*specs.BUILDS.iterdir(), *specs.TOKENIZERS.iterdir())
    ]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)


@pytest.mark.parametrize("name", ["../../../../tmp/x", "sub/name", ".hidden", ""])
def test_a_spec_name_is_a_plain_name(name):
    with pytest.raises(SpecError, match="is not a name"):
        build_spec(name)


@pytest.mark.parametrize(("name", "says"), [("../../etc/x", "is not a name"), ("", "--published must not be empty")])
def test_verify_refuses_a_published_name_that_is_not_a_name(name, says, tmp_path, capsys):
    assert main(["verify", str(tmp_path), "--published", name]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "edit, says",
    [
        (None, "cannot read it"),
        ({"template_kwargs": None}, "template_kwargs is null, not an object"),
        ({"files": {"tiktoken.model": {"bytes": 1}}}, "files.tiktoken.model.sha256 is missing"),
        ({"files": {}}, "'files' needs tiktoken.model with its 'bytes' and 'sha256'"),
        ({"name": "other"}, "'name' is 'other', not the file's name 'zz'"),
        ({"chat_template": "other.jinja"}, "unknown key 'chat_template' (known: name, repo, revision"),
        ('{"name": "zz", "name": "zz"}', "cannot read it (duplicate key 'name')"),
    ],
)
def test_a_broken_tokenizer_spec_is_named(kimi_dir, tmp_path, monkeypatch, edit, says):
    """Every build reads all tokenizer specs: one that is broken is named, whatever the tokenizer used."""
    from fixed_sft import specs

    folder = tmp_path / "tokenizers"
    folder.mkdir()
    spec = json.loads((specs.TOKENIZERS / "kimi-k2.6.json").read_text())
    (folder / "kimi-k2.6.json").write_text(json.dumps(spec))
    text = edit if isinstance(edit, str) else json.dumps({**spec, "name": "zz", **edit}) if edit else "{broken"
    (folder / "zz.json").write_text(text)
    monkeypatch.setattr(specs, "TOKENIZERS", folder)
    with pytest.raises(SpecError, match=re.escape(f"{folder / 'zz.json'}: ") + ".*" + re.escape(says)):
        resolve_tokenizer(str(kimi_dir))


def test_a_build_spec_value_of_the_wrong_type_is_named(tmp_path, monkeypatch):
    from fixed_sft import specs

    (tmp_path / "b.json").write_text(json.dumps({"source": "x.jsonl", "rows": "6400"}))
    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    with pytest.raises(SpecError, match=re.escape('b.json: rows is "6400", not an integer or "all" or null')):
        build_spec("b")


def test_build_spec_keys(tmp_path, monkeypatch):
    """Null means not given, rows may be "all", and a misspelt key is named."""
    from fixed_sft import specs
    from fixed_sft.cli import _config, parser

    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    (tmp_path / "all.json").write_text(json.dumps({"source": "x.jsonl", "rows": "all", "seed": None}))
    config, _, _ = _config(parser().parse_args(["build", "all"]))
    assert (config.rows, config.seed) == (None, 42)
    (tmp_path / "typo.json").write_text(json.dumps({"source": "x.jsonl", "row_token": 512}))
    with pytest.raises(SpecError, match="typo.json: unknown key 'row_token'"):
        build_spec("typo")


def test_hidden_files_in_the_spec_folder_are_not_specs(kimi_dir, tmp_path, monkeypatch):
    """Such as the ``._NAME.json`` files macOS leaves beside copied files."""
    from fixed_sft import specs

    (tmp_path / "kimi-k2.6.json").write_text((specs.TOKENIZERS / "kimi-k2.6.json").read_text())
    (tmp_path / "._kimi-k2.6.json").write_bytes(b"\x00\x05\x16\x07")
    monkeypatch.setattr(specs, "TOKENIZERS", tmp_path)
    assert resolve_tokenizer(str(kimi_dir)).name == "kimi-k2.6"


def test_source_files_in_a_build_spec(tmp_path, monkeypatch):
    """A spec's ``source_files`` choose its source's files; another ``--source`` drops
    them, as it drops the revision; they must be a non-empty list of non-empty globs."""
    from fixed_sft import specs
    from fixed_sft.cli import _config, parser

    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    (tmp_path / "split.json").write_text(json.dumps({"source": "org/data", "source_files": ["data/train-*"]}))
    config, _, _ = _config(parser().parse_args(["build", "split"]))
    assert config.source_files == ("data/train-*",)
    config, _, _ = _config(parser().parse_args(["build", "split", "--source", "x.jsonl"]))
    assert config.source_files is None
    config, _, _ = _config(parser().parse_args(["build", "split", "--source-files", "a*", "--source-files", "b*"]))
    assert config.source_files == ("a*", "b*")
    for bad in ("data/train-*", [], [""], [3]):
        (tmp_path / "bad.json").write_text(json.dumps({"source": "org/data", "source_files": bad}))
        with pytest.raises(
            SpecError, match="bad.json: source_files is .*, not a non-empty array of non-empty strings or null"
        ):
            build_spec("bad")


@pytest.mark.parametrize("key", ["rows", "seed", "source_rows"])
def test_a_build_spec_boolean_is_not_an_integer(tmp_path, monkeypatch, key):
    from fixed_sft import specs

    (tmp_path / "b.json").write_text(json.dumps({"source": "x.jsonl", key: True}))
    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    with pytest.raises(SpecError, match=f"b.json: {key} is true, not an integer"):
        build_spec("b")


def test_a_spec_that_is_not_a_json_object_is_named(tmp_path, monkeypatch):
    from fixed_sft import specs

    (tmp_path / "b.json").write_text("[]")
    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    with pytest.raises(SpecError, match="b.json: not a JSON object"):
        build_spec("b")


def test_an_unknown_spec_name_lists_the_known_ones():
    with pytest.raises(SpecError, match=f"no build spec named 'nope' in .*known: .*{DEFAULT_BUILD}"):
        build_spec("nope")


def test_spec_name_downloads_at_the_revision_given(fake_hub):
    """--tokenizer-revision overrides the spec's pinned revision."""
    resolved = resolve_tokenizer("kimi-k2.6", revision="abc")
    assert {rev for _, _, rev in fake_hub} == {"abc"}
    assert resolved.revision == "abc" and resolved.pinned


def test_the_spec_decides_template_kwargs_and_loss_mask(kimi_dir, tmp_path, monkeypatch):
    """A pinned spec's template_kwargs and loss_mask_type are what the build uses."""
    from fixed_sft import specs

    spec = json.loads((specs.TOKENIZERS / "kimi-k2.6.json").read_text())
    spec.update(template_kwargs={"thinking": False}, loss_mask_type="other")
    (tmp_path / "kimi-k2.6.json").write_text(json.dumps(spec))
    monkeypatch.setattr(specs, "TOKENIZERS", tmp_path)
    resolved = resolve_tokenizer(str(kimi_dir))
    assert (resolved.template_kwargs, resolved.loss_mask_type) == ({"thinking": False}, "other")


def _folder_of(kimi_dir, folder, changed: dict[str, bytes]) -> Path:
    folder.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja"):
        if name in changed:
            (folder / name).write_bytes(changed[name])
        else:
            (folder / name).symlink_to(Path(kimi_dir) / name)
    return folder


def test_an_unpinned_folder_records_no_repo(kimi_dir, tmp_path):
    """A folder matching no spec has a null repo: the manifest holds no path of this machine."""
    folder = _folder_of(kimi_dir, tmp_path / "tok", {"chat_template.jinja": b"{{ x }}"})
    resolved = resolve_tokenizer(str(folder), allow_unpinned=True)
    assert (resolved.name, resolved.repo, resolved.pinned) == (None, None, False)


def test_the_closest_spec_is_the_one_sharing_most_files(kimi_dir, tmp_path, monkeypatch):
    from fixed_sft import specs

    spec = json.loads((specs.TOKENIZERS / "kimi-k2.6.json").read_text())
    other = {**spec, "name": "other", "files": {name: {"bytes": 1, "sha256": "0" * 64} for name in spec["files"]}}
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "kimi-k2.6.json").write_text(json.dumps(spec))
    (tmp_path / "specs" / "other.json").write_text(json.dumps(other))
    monkeypatch.setattr(specs, "TOKENIZERS", tmp_path / "specs")
    folder = _folder_of(kimi_dir, tmp_path / "tok", {"chat_template.jinja": b"{{ x }}"})
    mismatches = resolve_tokenizer(str(folder), allow_unpinned=True).mismatches
    assert mismatches[1].startswith("closest is kimi-k2.6, from which chat_template.jinja: expected")


def test_files_sharing_nothing_with_any_spec_are_named_by_their_hashes(kimi_dir, tmp_path):
    from fixed_sft.hashes import sha256_file

    changed = {"tiktoken.model": b"a", "tokenizer_config.json": b"{}", "chat_template.jinja": b"{{ x }}"}
    folder = _folder_of(kimi_dir, tmp_path / "tok", changed)
    mismatches = resolve_tokenizer(str(folder), allow_unpinned=True).mismatches
    assert mismatches == ["the files match no pinned spec"] + [
        f"{name} sha256 {sha256_file(folder / name)}"
        for name in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja")
    ]


def test_a_build_spec_without_a_source_is_named(tmp_path, monkeypatch):
    from fixed_sft import specs

    (tmp_path / "b.json").write_text(json.dumps({"rows": 10}))
    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    with pytest.raises(SpecError, match="b.json: source is missing"):
        build_spec("b")


def test_a_damaged_cached_tokenizer_file_is_refused(kimi_dir, tmp_path, monkeypatch):
    """A cached tokenizer file whose bytes are not the ones the Hub named it by is refused,
    even where it would pass the spec's check, naming the blob to delete."""
    snapshot = (
        tmp_path / "hub" / "models--moonshotai--Kimi-K2.6" / "snapshots" / tokenizer_spec("kimi-k2.6")["revision"]
    )
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(kimi_dir / name)
    cache_link(snapshot, "tiktoken.model", (kimi_dir / "tiktoken.model").read_bytes(), etag="e" * 64)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", lambda repo_id, filename, **kwargs: str(snapshot / filename))
    with pytest.raises(
        SpecError,
        match=re.escape(
            f"{snapshot / 'tiktoken.model'} is damaged in the Hugging Face cache: the Hub's digest of it is {'e' * 64}"
        ),
    ):
        resolve_tokenizer("kimi-k2.6")


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"row_tokens": 1}, "row_tokens must be between 2 and"),
        ({"rows": 0}, "rows must be a positive number or 'all', got 0"),
        ({"seed": -1}, "seed must be between 0 and 2**64 - 1"),
        ({"loss_mask_type": "other"}, "unknown loss_mask_type 'other'"),
    ],
)
def test_a_build_spec_value_out_of_range_names_the_spec(tmp_path, monkeypatch, capsys, values, says):
    """Even where a flag gives the value the build uses: the spec file itself is wrong."""
    from fixed_sft import specs

    (tmp_path / "b.json").write_text(json.dumps({"source": "x.jsonl", **values}))
    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    assert (
        main(
            [
                "build",
                "b",
                "--row-tokens",
                "256",
                "--rows",
                "2",
                "--seed",
                "1",
                "--loss-mask-type",
                "kimi_k25",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'b.json'}: {says}") and len(err.strip().splitlines()) == 1


def test_build_config_defaults_are_the_default_builds():
    """A ``--source`` build without a name takes these defaults (README: the default build's)."""
    from fixed_sft.build import BuildConfig

    spec, defaults = build_spec(DEFAULT_BUILD), BuildConfig(name="x", source="x")
    assert {key: getattr(defaults, key) for key in ("tokenizer", "loss_mask_type", "rows", "row_tokens", "seed")} == {
        key: spec[key] for key in ("tokenizer", "loss_mask_type", "rows", "row_tokens", "seed")
    }
