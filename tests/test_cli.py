"""Command line: flags, exit codes (0 ok, 1 failure/mismatch, 2 usage), messages."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, cache_link

from fixed_sft.cli import main
from fixed_sft.specs import DEFAULT_BUILD, build_spec
from fixed_sft.verify import published_comparison


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "rows.jsonl"
    synthetic.write_jsonl(synthetic.conversations(200, seed=3), path)
    return path


def _build_args(source, kimi_dir, out, *extra):
    return [
        "build",
        "--source",
        str(source),
        "--tokenizer",
        str(kimi_dir),
        "--rows",
        "3",
        "--row-tokens",
        "256",
        "--out",
        str(out),
        "--workers",
        "1",
        "--quiet",
        *extra,
    ]


def test_build_then_verify(source, kimi_dir, tmp_path, capsys):
    assert main(_build_args(source, kimi_dir, tmp_path / "o")) == 0
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert (
        f"3 rows x 256 tokens, supervised ratio {manifest['stats']['supervised_token_ratio']:.4f}, "
        f"rows_sha256 {manifest['rows_sha256']}" in capsys.readouterr().out
    )
    assert main(["verify", str(tmp_path / "o")]) == 0
    assert "matches its manifest" in capsys.readouterr().out


def test_a_build_closes_with_a_summary_of_its_manifest_unless_quiet(source, kimi_dir, tmp_path, capsys):
    args = [a for a in _build_args(source, kimi_dir, tmp_path / "o", "--skip-invalid") if a != "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    stats = manifest["stats"]
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert f"{stats['trainable_tokens']:,}" in lines["trainable tokens"]
    assert f"{stats['conversations']:,} ({stats['conversations_split']:,} split" in lines["conversations"]
    assert manifest["rows_sha256"] in lines["rows_sha256"] and "3 x 256 tokens = 768" in lines["rows"]
    assert "tokenize" not in out and "write" not in out  # no progress bars where stdout is not a terminal
    assert main(_build_args(source, kimi_dir, tmp_path / "q")) == 0
    assert "trainable tokens" not in capsys.readouterr().out


def test_a_build_that_replaces_one_of_other_rows_says_so(source, kimi_dir, tmp_path, capsys):
    """A build into the folder of an earlier build replaces it (a rebuild): where its rows
    were others, the closing line names the rows it replaced."""
    out = tmp_path / "o"
    assert main(_build_args(source, kimi_dir, out)) == 0
    earlier = json.loads((out / "manifest.json").read_text())["rows_sha256"]
    assert "replaced" not in capsys.readouterr().out
    assert main(_build_args(source, kimi_dir, out)) == 0  # (the same rows again)
    assert "replaced" not in capsys.readouterr().out
    assert main([*_build_args(source, kimi_dir, out), "--seed", "7"]) == 0
    says = f"  (it replaced the earlier build there, of other rows: rows_sha256 {earlier})\n"
    assert capsys.readouterr().out.endswith(says)


def test_verify_mismatch_exits_1(source, kimi_dir, tmp_path, capsys):
    main(_build_args(source, kimi_dir, tmp_path / "o"))
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    manifest["rows_sha256"] = "0" * 64
    (tmp_path / "o" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", str(tmp_path / "o")]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--row-tokens", "1"], "row-tokens"),
        (["--rows", "0"], "--rows"),
        (["--seed", "-1"], "seed"),
        (["--seed", str(2**64)], "seed"),
        (["--loss-mask-type", "other"], "loss-mask-type"),
        (["--out", "/proc/self/o"], "--out"),
        (["--out", "/proc/nowhere/o"], "--out"),
        (["--source-files", "*", "--source-files", ""], "--source-files must not be empty"),
        (["--workers", "0"], "--workers must be between 1 and 1024, got 0"),
        (["--workers", str(10**20)], "--workers must be between 1 and 1024"),
    ],
)
def test_bad_parameters_exit_2(source, kimi_dir, tmp_path, capsys, extra, message):
    assert main([*_build_args(source, kimi_dir, tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_unknown_build_name_exits_2(capsys):
    assert main(["build", "no-such-build"]) == 2
    assert "no build spec named 'no-such-build'" in capsys.readouterr().err


def test_rows_must_be_a_number(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--rows", "many"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("argv", [["verfy", "out/mine"], ["verfy"], ["insepct", "out"]])
def test_a_mistyped_command_is_named_with_the_closest_command(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    closest = {"verfy": "verify", "insepct": "inspect"}[argv[0]]
    assert exit_.value.code == 2 and f"no command or build named {argv[0]!r} (did you mean {closest}?)" in err


@pytest.mark.parametrize("given", ["chats.jsonl", "data.parquet", "folder"])
def test_a_source_where_a_build_name_goes_says_to_give_it_with_source(capsys, tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([given])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"a source file or folder is given with --source: --source {given}" in err


def test_a_mistyped_flag_is_named_in_one_line_with_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--rows-tokens", "64"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert (
        err
        == "generate_fixed_sft.py build: error: unrecognized arguments: --rows-tokens (did you mean --row-tokens?)\n"
    )
    with pytest.raises(SystemExit):
        main(["verify", "out", "--sampel", "3"])
    err = capsys.readouterr().err
    assert err.startswith("generate_fixed_sft.py verify: error: ") and "--sample?" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, says",
    [
        (["build", "--source", "", "--rows", "2"], "error: --source must not be empty\n"),  # (else read as ".")
        (["verify", "out", "--rebuild", "--tokenizer="], "error: --tokenizer must not be empty\n"),
        (["diff", "", "out"], "error: an argument must not be empty\n"),
        (["verify", "out", "--rebuild", ""], "error: an argument must not be empty\n"),  # (no flag's value)
        (["verify", "out", "--rebuild", "--sou", ""], "error: --sou must not be empty\n"),  # (an abbreviation)
    ],
)
def test_an_empty_value_is_a_one_line_usage_error(capsys, argv, says):
    assert main(argv) == 2
    assert capsys.readouterr().err == says


@pytest.mark.parametrize(
    "argv, says",
    [
        (["build", "--rows", "abc"], "argument --rows: expected a number or 'all', got 'abc'"),
        (["build", "--seed", "0x10"], "argument --seed: invalid int value: '0x10'"),
        (["build", "--template-kwargs", '{"thinking": 1e999}'], "not JSON (1e999 is out of the range of a float)"),
        (["verify"], "the following arguments are required: DIR"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_one_line_usage_error(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_a_fork_server_that_ends_before_a_worker_starts_is_a_worker_that_ended(
    source, kimi_dir, tmp_path, capsys, monkeypatch
):
    """multiprocessing reads a new worker's pid from the fork server: one killed before
    (by the system, out of memory) ends that read, which the build reports as it does a
    worker that ended, in one line, nothing written."""
    from multiprocessing import forkserver

    def ended(*args):
        raise EOFError("unexpected EOF")

    monkeypatch.setattr(forkserver, "read_signed", ended)
    assert main(_build_args(source, kimi_dir, tmp_path / "o", "--workers", "2", "--no-cache")) == 1
    err = capsys.readouterr().err
    assert err == "error: a worker process ended abruptly (killed by a signal, or by the system when out of memory)\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_source_error_exits_1(kimi_dir, tmp_path, capsys, workers):
    """The source fails while the encoder or the workers are still starting: one clear
    error, nothing written, start-up wound down."""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert main(_build_args(bad, kimi_dir, tmp_path / "o", "--workers", workers)) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "Parquet" in err and "internal error" not in err
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".o.lock", "bad.parquet"]  # no temporary folder left


@pytest.mark.parametrize("workers", ["1", "2"])
def test_unusable_tokenizer_exits_1_naming_it(source, kimi_dir, tmp_path, capsys, workers):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tiktoken.model", "chat_template.jinja"):
        (folder / name).symlink_to(kimi_dir / name)
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["163606"]["content"] = "[EOS]x"  # holds [EOS]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    args = _build_args(source, folder, tmp_path / "o", "--allow-unpinned-tokenizer", "--workers", workers)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "special tokens '[EOS]' and '[EOS]x' overlap" in err and "internal error" not in err
    assert not (tmp_path / "o").exists()


def test_default_build_offline_says_how_to_pass_local_files(tmp_path):
    """The bare command (with the recipe's flags) builds the default dataset; with no
    Hub it stops with a clear error instead of a traceback."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "generate_fixed_sft.py"),
            "--loss-mask-type",
            "kimi_k25",
            "--trust-remote-code",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "--tokenizer FOLDER" in result.stderr or "--source PATH" in result.stderr


def test_published_values_reported(source, kimi_dir, tmp_path, capsys):
    main(_build_args(source, kimi_dir, tmp_path / "o"))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o"), "--published", DEFAULT_BUILD]) == 1
    out = capsys.readouterr().out
    assert "not the same as the values published for kimi-k26-tulu3-fixed8192-v1" in out
    for key in ("rows_sha256", "parquet_sha256", "parquet_bytes", "supervised_token_ratio"):
        assert f"{key}: differs" in out
    assert "padding_tokens: same" in out


def test_published_comparison_matches_equal_values():
    published = build_spec(DEFAULT_BUILD)["published"]
    manifest = {
        "rows_sha256": published["rows_sha256"],
        "parquet": {"sha256": published["parquet_sha256"], "bytes": published["parquet_bytes"]},
        "stats": {"supervised_token_ratio": 0.66612, "padding_tokens": 0},
    }
    assert all(equal for *_, equal in published_comparison(manifest, published))
    manifest["stats"]["supervised_token_ratio"] = 0.6671
    assert not all(equal for *_, equal in published_comparison(manifest, published))


def test_verify_with_unknown_published_name_exits_2(tmp_path, capsys):
    assert main(["verify", str(tmp_path), "--published", "nope"]) == 2
    assert "no build spec named 'nope'" in capsys.readouterr().err


def test_default_workers_are_the_cores_this_process_may_use(monkeypatch):
    from fixed_sft.cli import parser

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert parser().parse_args(["build"]).workers == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(2000)), raising=False)
    assert parser().parse_args(["build"]).workers == 1024  # the most a build takes


@pytest.mark.parametrize("set_by_user", [None, "4"])
def test_the_processes_of_a_command_start_no_blas_threads_unless_asked(monkeypatch, capsys, set_by_user):
    """numpy's OpenBLAS spins a thread per core as it loads; a build does no linear algebra."""
    if set_by_user is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", set_by_user)
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    assert os.environ["OPENBLAS_NUM_THREADS"] == (set_by_user or "1")


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fixed_sft.build.build", interrupted)
    assert main(["build", "--source", "x.jsonl"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_ctrl_c_while_the_command_line_loads_exits_130(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr("fixed_sft.cli.parser", interrupted)
    assert main(["build", "--source", "x.jsonl"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_what_the_system_refuses_is_one_line_naming_the_file(source, kimi_dir, tmp_path, capsys):
    long_name = str(tmp_path / ("x" * 300 + ".jsonl"))  # past the file system's name limit
    assert main(["build", "--source", long_name, "--tokenizer", str(kimi_dir), "--workers", "1", "--quiet"]) == 1
    assert capsys.readouterr().err == f"error: {long_name}: File name too long\n"
    room = 255 - len(f"..tmp-{os.getpid()}")  # (the longest name whose build folder's name fits)
    assert main(_build_args(source, kimi_dir, tmp_path / ("y" * room))) == 0
    for length in (room + 1, 255):  # (the lock's name fits, the build folder's does not; neither does)
        out = tmp_path / ("z" * length)
        assert main(_build_args(source, kimi_dir, out)) == 2
        says = f"error: output {out}: its name is too long for the folder .{out.name}.tmp-{os.getpid()} beside it"
        assert capsys.readouterr().err == says + "; choose another --out\n" and not list(tmp_path.glob(".z*"))
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = f"error: output {tmp_path / 'a'} is a loop of symbolic links; choose another --out\n"
    assert main(_build_args(source, kimi_dir, tmp_path / "a")) == 2 and capsys.readouterr().err == loop
    with pytest.MonkeyPatch.context() as patch:  # as from Python 3.13: resolve leaves a loop's link in place
        patch.setattr(Path, "resolve", lambda self, strict=False: Path(os.path.realpath(self)))
        assert main(_build_args(source, kimi_dir, tmp_path / "a")) == 2 and capsys.readouterr().err == loop


def test_an_error_quoting_a_line_break_from_the_data_stays_one_line(kimi_dir, tmp_path, capsys):
    """An id (or a library's message) may hold line breaks: they are shown as \\n, so no
    data can write a line of its own on stderr."""
    import json

    source = tmp_path / "evil.jsonl"
    row = {"id": "evil\nerror: a forged line\r", "messages": [{"role": "user", "content": 5}]}
    source.write_text(json.dumps(row) + "\n")
    assert main(_build_args(source, kimi_dir, tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "id evil\\nerror: a forged line\\n)" in err


def test_a_path_that_is_not_utf8_is_one_line_naming_it(source, kimi_dir, tmp_path, capsys):
    """pyarrow cannot open such a path, nor a manifest record it: a source file, an output
    or a folder to verify whose path is not UTF-8 is named, its bytes shown as \\xNN."""
    bad = os.fsdecode(b"\xff")
    shown = str(tmp_path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    (tmp_path / "src").mkdir()
    synthetic.write_parquet(synthetic.conversations(20, seed=1), tmp_path / "src" / "a.parquet")
    (tmp_path / "src" / "a.parquet").rename(tmp_path / "src" / f"{bad}.parquet")
    assert main(_build_args(tmp_path / "src", kimi_dir, tmp_path / "o")) == 1
    assert (
        capsys.readouterr().err
        == f"error: {shown}/src/\\xff.parquet: the path is not valid UTF-8, which a manifest cannot record; rename it\n"
    )
    assert main(_build_args(source, kimi_dir, tmp_path / bad)) == 2
    assert (
        capsys.readouterr().err
        == f"error: output {shown}/\\xff: the path is not valid UTF-8, which pyarrow cannot write; "
        "choose another --out\n"
    )
    assert main(_build_args(source, kimi_dir, tmp_path / "o")) == 0
    (tmp_path / "o").rename(tmp_path / bad)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / bad)]) == 1
    assert (
        capsys.readouterr().out
        == f"MISMATCH {shown}/\\xff: the path is not valid UTF-8, which pyarrow cannot open; rename it\n"
    )
    assert [p.name for p in tmp_path.glob(".*")] == [".o.lock"]  # nothing for the refused output


def test_an_internal_error_is_one_line_unless_debugging(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("fixed_sft.build.build", broken)
    assert main(["build", "--source", "x.jsonl"]) == 1
    assert capsys.readouterr().err == (
        "error: internal error (RuntimeError: boom); FIXED_SFT_DEBUG=1 shows the traceback\n"
    )
    monkeypatch.setenv("FIXED_SFT_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["build", "--source", "x.jsonl"])


def test_published_values_that_are_the_same_exit_0(source, kimi_dir, tmp_path, capsys, monkeypatch):
    assert main(_build_args(source, kimi_dir, tmp_path / "o")) == 0
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    published = {
        "by": "a test",
        "rows_sha256": manifest["rows_sha256"],
        "parquet_bytes": manifest["parquet"]["bytes"],
        "supervised_token_ratio": round(manifest["stats"]["supervised_token_ratio"], 3),
    }
    monkeypatch.setattr("fixed_sft.specs.build_spec", lambda name: {"published": published})
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o"), "--published", "some-build"]) == 0
    out = capsys.readouterr().out
    assert "the same as the values published for some-build by a test" in out and "differs" not in out


def test_main_runs_outside_the_main_thread(tmp_path, capsys):
    """Signal handlers are only the main thread's to set; elsewhere main still answers."""
    import threading

    codes = []
    thread = threading.Thread(target=lambda: codes.append(main(["verify", str(tmp_path / "nowhere")])))
    thread.start()
    thread.join()
    assert codes == [1] and "no such folder" in capsys.readouterr().out


def test_hub_names_resolve_through_the_hugging_face_cache(kimi_dir, tmp_path):
    """With HF_HUB_OFFLINE=1 huggingface_hub itself serves the pinned revisions from its
    cache: the named build gets its tokenizer (checked against the spec's hashes) and
    source from there, a rebuild gets what the manifest records, a branch is recorded as
    the commit it names, and a changed cached file is refused: a source file whose bytes
    are not the ones its blob is named by, and a tokenizer file unlike the spec's."""
    spec = build_spec(DEFAULT_BUILD)
    tokenizer = json.loads((ROOT / "fixed_sft" / "tokenizer_specs" / f"{spec['tokenizer']}.json").read_text())
    hub = tmp_path / "hf" / "hub"
    snapshot = hub / f"models--{tokenizer['repo'].replace('/', '--')}" / "snapshots" / tokenizer["revision"]
    snapshot.mkdir(parents=True)
    for name in tokenizer["files"]:
        (snapshot / name).symlink_to(kimi_dir / name)
    data = hub / f"datasets--{spec['source'].replace('/', '--')}" / "snapshots" / spec["source_revision"]
    shard = synthetic.write_parquet(synthetic.conversations(200, seed=5), tmp_path / "shard.parquet")[0]
    cache_link(data, "data/train-00000-of-00001.parquet", shard.read_bytes())  # stored with Git LFS
    (data / "README.md").write_text("not data\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))

    def run(*args):
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "generate_fixed_sft.py"),
                *args,
                "--rows",
                "2",
                "--row-tokens",
                "256",
                "--workers",
                "1",
                "--quiet",
                "--no-card",  # (not under test)
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )

    named = run(DEFAULT_BUILD, "--out", "named")
    assert named.returncode == 1
    assert f"has 200 rows; {DEFAULT_BUILD} expects {spec['source_rows']}" in named.stderr

    built = run("build", "--source", spec["source"], "--source-revision", spec["source_revision"], "--out", "o")
    assert built.returncode == 0, built.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert (manifest["source"]["name"], manifest["source"]["revision"]) == (spec["source"], spec["source_revision"])
    assert [f["path"] for f in manifest["source"]["files"]] == ["data/train-00000-of-00001.parquet"]
    assert manifest["tokenizer"]["pinned"] is True
    assert (manifest["tokenizer"]["repo"], manifest["tokenizer"]["revision"]) == (
        tokenizer["repo"],
        tokenizer["revision"],
    )
    rebuilt = subprocess.run(
        [sys.executable, str(ROOT / "generate_fixed_sft.py"), "verify", "o", "--rebuild", "--workers", "1", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )  # the recorded source and tokenizer, from the cache
    assert rebuilt.returncode == 0 and "gives the same rows" in rebuilt.stdout, rebuilt.stdout + rebuilt.stderr

    for pinned, newer in ((snapshot, "1" * 40), (data, "2" * 40)):  # main is a commit after the pinned one
        shutil.copytree(pinned, pinned.parent / newer, symlinks=True)
        (pinned.parent.parent / "refs").mkdir()
        (pinned.parent.parent / "refs" / "main").write_text(newer)
    by_branch = run(
        "build",
        "--source",
        spec["source"],
        "--source-revision",
        "main",
        "--tokenizer",
        tokenizer["repo"],
        "--tokenizer-revision",
        "main",
        "--out",
        "main",
    )
    assert by_branch.returncode == 0, by_branch.stderr
    manifest = json.loads((tmp_path / "main" / "manifest.json").read_text())
    assert (manifest["source"]["revision"], manifest["tokenizer"]["revision"]) == ("2" * 40, "1" * 40)

    blob = (data / "data" / "train-00000-of-00001.parquet").resolve()
    synthetic.write_parquet(synthetic.conversations(200, seed=6), blob)  # other rows under the Hub's sha256
    damaged = run("build", "--source", spec["source"], "--source-revision", spec["source_revision"], "--out", "o3")
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr
    assert "train-00000-of-00001.parquet is damaged in the Hugging Face cache" in damaged.stderr
    assert f"delete {blob} and run again" in damaged.stderr and not (tmp_path / "o3").exists()

    (snapshot / "chat_template.jinja").unlink()
    (snapshot / "chat_template.jinja").write_text((kimi_dir / "chat_template.jinja").read_text() + " ")
    changed = run("build", "--source", spec["source"], "--source-revision", spec["source_revision"], "--out", "o2")
    assert changed.returncode == 1 and "chat_template.jinja" in changed.stderr and "Traceback" not in changed.stderr
    assert not (tmp_path / "o2").exists()

    (snapshot / "chat_template.jinja").unlink()  # offline, a file the cache lacks is named
    lacking = run("build", "--source", spec["source"], "--source-revision", spec["source_revision"], "--out", "o4")
    assert lacking.returncode == 1 and "Traceback" not in lacking.stderr, lacking.stderr
    assert "from the Hugging Face Hub or its cache (chat_template.jinja: " in lacking.stderr


@pytest.mark.parametrize("file", ["train.parquet", "manifest.json"])
def test_a_full_disk_names_the_file_it_could_not_write(source, kimi_dir, tmp_path, capsys, monkeypatch, file):
    """Out of space (as pyarrow and Python report it, without the file's name) while
    writing the rows or the manifest: one line naming the file, nothing published."""
    import errno

    import pyarrow.parquet as pq

    from fixed_sft import build as build_module

    def no_space(*args, **kwargs):
        if file == "train.parquet":  # pyarrow's wording
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        raise OSError(errno.ENOSPC, "No space left on device")

    if file == "train.parquet":
        monkeypatch.setattr(pq.ParquetWriter, "write_table", no_space)
    else:
        monkeypatch.setattr(build_module.json, "dump", no_space)
    assert main(_build_args(source, kimi_dir, tmp_path / "o")) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"error: cannot write {re.escape(str(tmp_path))}/\.o\.tmp-\d+/{file}: "
        r"No space left on device\n",
        err,
    ), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".o.lock"]


def test_verify_of_a_hostile_folder_names_it_in_one_line(source, kimi_dir, tmp_path, capsys):
    """A Parquet bomb and a sparse huge manifest: exit 1, one MISMATCH line, no traceback."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert main(_build_args(source, kimi_dir, tmp_path / "o")) == 0
    parquet = tmp_path / "o" / "train.parquet"
    table = pq.read_table(parquet)
    zeros = pa.array(np.zeros(5_000_000, np.int32))
    metadata = table.column("metadata").combine_chunks()
    big = pa.ListArray.from_arrays(pa.array([0, 5_000_000], pa.int32()), zeros)
    fields = [
        big
        if f.name == "input_ids"
        else big.cast(pa.list_(pa.uint8()))
        if f.name == "loss_mask"
        else metadata.field(f.name).slice(0, 1)
        for f in metadata.type
    ]
    bomb = pa.Table.from_arrays(
        [table.column("messages").slice(0, 1), pa.StructArray.from_arrays(fields, fields=list(metadata.type))],
        schema=table.schema,
    )
    pq.write_table(bomb, parquet, compression="zstd")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o")]) == 1
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.endswith(
        f"MISMATCH {parquet}: row group 0 (rows 0 to 0) holds 5000000 metadata.input_ids values, more than its 1 rows "
        "of 256 tokens and one more row; not decoded\n"
    )
    with (tmp_path / "o" / "manifest.json").open("r+b") as f:
        f.truncate(3 << 30)
    assert main(["verify", str(tmp_path / "o"), "--rebuild"]) == 1
    captured = capsys.readouterr()
    assert (
        captured.err == ""
        and captured.out.startswith(f"MISMATCH {tmp_path / 'o' / 'manifest.json'}: 3221225472 bytes, more than the ")
        and captured.out.count("\n") == 1
    )


def test_quiet_turns_the_hubs_download_bars_off_for_a_build_that_may_download(source, kimi_dir, tmp_path, monkeypatch):
    """huggingface_hub's bars are off inside a quiet build that may download (a source or a
    tokenizer not a local path), and left as they are (not imported) for one that cannot."""
    from huggingface_hub.utils import are_progress_bars_disabled

    import fixed_sft.build as build_module
    import fixed_sft.cli as cli
    from fixed_sft.params import BuildConfig

    seen = []
    real = build_module.build
    monkeypatch.setattr(
        build_module, "build", lambda *a, **k: seen.append(are_progress_bars_disabled()) or real(*a, **k)
    )
    before, may_download = are_progress_bars_disabled(), cli._may_download
    assert main(_build_args(source, kimi_dir, tmp_path / "q")) == 0
    monkeypatch.setattr(cli, "_may_download", lambda config: True)
    assert main(_build_args(source, kimi_dir, tmp_path / "q2")) == 0
    assert main([a for a in _build_args(source, kimi_dir, tmp_path / "loud") if a != "--quiet"]) == 0
    assert seen == [before, True, before] and are_progress_bars_disabled() == before
    local = BuildConfig(name="x", source=str(source), tokenizer=str(kimi_dir))
    assert not may_download(local)
    assert may_download(dataclasses.replace(local, tokenizer="moonshotai/Kimi-K2.6"))
    assert may_download(dataclasses.replace(local, source="allenai/tulu-3-sft-mixture"))


def test_a_token_store_named_and_turned_off_is_a_usage_error(tmp_path, capsys):
    assert main(["--source", "x.jsonl", "--cache-dir", str(tmp_path), "--no-cache", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "error: --cache-dir names a token store that --no-cache turns off; give one\n"
    assert not (tmp_path / "o").exists()
