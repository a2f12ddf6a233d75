"""``push``: a verified build uploaded to a Hub dataset repo in one commit, against a local
fake of the Hub's HTTP API (``fake_hub``), with ``huggingface_hub``'s own client."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import ROOT
from fake_hub import FakeHub, Repo

from fixed_sft.build import BuildConfig, build
from fixed_sft.cli import main
from fixed_sft.verify import verify

REPO = "someone/packed"


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("push")
    rows = [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": "hi " * (i % 4 + 1)},
                {"role": "assistant", "content": "ok " * (i % 6 + 1)},
            ],
        }
        for i in range(200)
    ]
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = BuildConfig(
        name="p", source=str(folder / "rows.jsonl"), tokenizer=str(kimi_dir), rows=8, row_tokens=64, seed=2, workers=1
    )
    build(config, folder / "out", progress=False)
    return folder / "out"


@pytest.fixture
def folder(built, tmp_path):
    copy = tmp_path / "build"
    shutil.copytree(built, copy)
    return copy


@pytest.fixture
def hub(monkeypatch):
    """The fake Hub, and huggingface_hub pointed at it (as ``HF_ENDPOINT`` does at import),
    with the fake's token, online, and Git LFS in place of Xet."""
    import huggingface_hub.constants as constants

    with FakeHub() as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setenv("HF_TOKEN", fake.token)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        yield fake


def test_push_uploads_the_build_and_its_card_in_one_commit(folder, hub, tmp_path, capsys):
    assert main(["push", str(folder), "--quiet", "--repo", REPO, "--private"]) == 0
    repo = hub.repos[REPO]
    assert repo.private
    (commit,) = repo.commits
    card = sorted(json.loads((folder / "manifest.json").read_text())["card"]["files"])
    assert "README.md" in card and any(name.endswith(".png") for name in card)
    names = ["manifest.json", "train.parquet", *card]
    assert sorted(commit["files"]) == sorted(names)
    for name in names:
        assert commit["files"][name] == (folder / name).read_bytes(), name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert commit["summary"] == "fixed-sft build p: 8 rows x 64 tokens"
    assert commit["description"] == f"rows_sha256 {manifest['rows_sha256']}"
    assert ("PUT", f"/lfs/{manifest['parquet']['sha256']}") in hub.requests  # the Parquet file went by LFS
    out = capsys.readouterr().out
    assert out.startswith(f"pushed {folder} to {hub.url}/datasets/{REPO} in commit {repo.sha}: manifest.json, ")
    assert sorted(out.strip().split(": ")[-1].split(", ")) == sorted(names)
    pulled = tmp_path / "pulled"  # what the Hub holds is the build, and verifies
    pulled.mkdir()
    for name in names:
        (pulled / name).write_bytes(repo.files[name])
    assert verify(pulled) == []


def test_only_the_files_the_manifest_records_are_pushed(folder, hub, capsys):
    """A file the build did not write (a picture, notes) passes ``verify``, which reads a
    build's own files, and stays out of the commit."""
    (folder / "holiday-photo.png").write_bytes(b"\x89PNG not the build's")
    (folder / "notes.txt").write_text("mine")
    assert verify(folder) == []
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 0
    (commit,) = hub.repos[REPO].commits
    card = json.loads((folder / "manifest.json").read_text())["card"]["files"]
    assert sorted(commit["files"]) == sorted(["manifest.json", "train.parquet", *card])


def test_a_repo_holding_other_files_is_refused_unless_forced(folder, hub, capsys):
    hub.repos[REPO] = Repo(private=False)
    hub.repos[REPO].files.update({"README.md": b"# mine\n", "data/old.parquet": b"old"})
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    assert capsys.readouterr().err == (
        f"error: push to {REPO}: the repo already holds README.md, data/old.parquet; add --force to push anyway "
        "(the build's files replace those of their names, the others stay)\n"
    )
    assert hub.repos[REPO].commits == []
    assert main(["push", str(folder), "--quiet", "--repo", REPO, "--force"]) == 0
    card = json.loads((folder / "manifest.json").read_text())["card"]["files"]
    assert sorted(hub.repos[REPO].files) == sorted(
        {".gitattributes", "README.md", "data/old.parquet", "manifest.json", "train.parquet", *card}
    )
    assert hub.repos[REPO].files["README.md"] == (folder / "README.md").read_bytes()  # (the card is the build's)


def test_a_repo_holding_a_card_of_its_own_is_refused_unless_forced(folder, hub, capsys):
    """A hand-written ``README.md`` is the repo's card: a build's card replaces it only with --force."""
    hub.repos[REPO] = Repo(private=False)
    hub.repos[REPO].files["README.md"] = b"# my other dataset\n"
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    assert "the repo already holds README.md; add --force" in capsys.readouterr().err
    assert hub.repos[REPO].commits == [] and hub.repos[REPO].files["README.md"] == b"# my other dataset\n"


def test_a_build_without_a_card_deletes_the_card_of_the_build_before(built, folder, hub, kimi_dir, tmp_path, capsys):
    """A build with --no-card pushed (--force) where another build's card is: the card's
    files are deleted in the same commit, so the repo never shows a card of other rows."""
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 0
    card = set(json.loads((folder / "manifest.json").read_text())["card"]["files"])
    bare = tmp_path / "bare"
    config = BuildConfig(
        name="p", source=str(built.parent / "rows.jsonl"), tokenizer=str(kimi_dir), rows=3, row_tokens=64, seed=5,
        workers=1, no_card=True,
    )  # fmt: skip
    build(config, bare, progress=False)
    capsys.readouterr()
    assert main(["push", str(bare), "--quiet", "--repo", REPO, "--force"]) == 0
    assert sorted(hub.repos[REPO].commits[-1]["deleted"]) == sorted(card)
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("  and deleted the card files the build lacks: ") and all(name in said for name in card)
    assert sorted(hub.repos[REPO].files) == [".gitattributes", "manifest.json", "train.parquet"]
    assert hub.repos[REPO].files["manifest.json"] == (bare / "manifest.json").read_bytes()


def test_a_second_push_to_the_same_repo_needs_force(folder, hub, capsys):
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 0
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    err = capsys.readouterr().err
    assert "the repo already holds " in err and "manifest.json" in err and "add --force" in err
    assert len(hub.repos[REPO].commits) == 1


def test_private_is_not_claimed_for_an_existing_public_repo(folder, hub, capsys):
    hub.repos[REPO] = Repo(private=False)
    assert main(["push", str(folder), "--quiet", "--repo", REPO, "--private"]) == 1
    assert capsys.readouterr().err == (
        f"error: push to {REPO}: the repo exists and is public; --private applies to a new repo only\n"
    )
    assert hub.repos[REPO].commits == []


def test_a_wrong_token_is_one_line_naming_the_repo(folder, hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    assert capsys.readouterr().err == (
        f"error: push to {REPO}: not authorized (HTTP 401); log in with `hf auth login` or set HF_TOKEN "
        "to a token that may write to it\n"
    )
    assert REPO not in hub.repos


def test_an_unreachable_hub_is_one_line_naming_the_repo(folder, hub, monkeypatch, capsys):
    import huggingface_hub.constants as constants

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: push to {REPO}: ConnectError: ") and err.count("\n") == 1


def test_a_commit_made_meanwhile_fails_the_push(folder, hub, capsys):
    """The commit names the repo state that was checked: another commit in between is refused."""

    def someone_else_commits(repo):
        repo.files["other.parquet"] = b"x"
        repo.sha = "f" * 40
        hub.on_info = None

    hub.on_info = someone_else_commits
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: push to {REPO}: HTTP 412: ") and err.count("\n") == 1
    assert hub.repos[REPO].commits == [] and "train.parquet" not in hub.repos[REPO].files


@pytest.mark.parametrize("change", ["README.md appended", "train.parquet appended", "train.parquet rewritten"])
def test_a_file_changed_once_hashed_is_not_what_the_hub_gets(folder, hub, capsys, change):
    """A file written to after its upload hash is made (as the repo is checked): the card
    is sent as the bytes hashed; the rows' file, sent from the file, fails the push, its
    upload (other bytes) or after the commit (the file's stamp: the commit is named)."""
    name, how = change.split()
    verified = (folder / name).read_bytes()

    def write(repo):
        with (folder / name).open("ab" if how == "appended" else "r+b") as f:
            f.write(b"appended" if how == "appended" else verified)
        hub.on_info = None

    hub.on_info = write
    code = main(["push", str(folder), "--quiet", "--repo", REPO])
    err = capsys.readouterr().err
    if name == "README.md":
        assert code == 0 and hub.repos[REPO].files["README.md"] == verified
        return
    assert code == 1 and err.startswith(f"error: push to {REPO}: ") and err.count("\n") == 1, err
    if how == "appended":
        assert "train.parquet" not in hub.repos[REPO].files
    else:
        commit = hub.repos[REPO].sha
        says = f"{folder / name} changed while it was uploaded; commit {commit} may hold other rows"
        assert says in err and hub.repos[REPO].files[name] == verified


def test_a_folder_that_does_not_verify_is_not_pushed(folder, hub, capsys):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["rows_sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    assert capsys.readouterr().err.startswith(f"error: {folder} does not verify, so it is not pushed: ")
    assert hub.requests == []


@pytest.mark.parametrize("repo", ["packed", "a/b/c", "a/", "/b", "a b/c"])
def test_a_repo_that_is_not_owner_slash_name_is_a_usage_error(folder, hub, repo, capsys):
    assert main(["push", str(folder), "--quiet", "--repo", repo]) == 2
    assert capsys.readouterr().err == f"error: --repo {repo!r} is not OWNER/NAME\n"
    assert hub.requests == []


def test_the_program_pushes_where_hf_endpoint_points(folder):
    """The program itself, in its own process, with the Hub named by ``HF_ENDPOINT``."""
    with FakeHub() as fake:
        env = dict(os.environ, HF_ENDPOINT=fake.url, HF_TOKEN=fake.token, HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1")
        env.pop("HF_HUB_OFFLINE", None)
        done = subprocess.run(
            [sys.executable, str(ROOT / "generate_fixed_sft.py"), "push", str(folder), "--repo", REPO],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        card = json.loads((folder / "manifest.json").read_text())["card"]["files"]
        assert sorted(fake.repos[REPO].commits[0]["files"]) == sorted(["manifest.json", "train.parquet", *card])


@pytest.mark.parametrize("name", ["train.parquet", "README.md", "supervised_ratio.png"])
def test_a_file_changed_after_verification_is_not_pushed(folder, hub, monkeypatch, capsys, name):
    """What is uploaded is what was verified: each file's upload hash must be the manifest's."""
    import fixed_sft.push as module

    real_verify = module.verify

    def verify_then_change(path):
        problems = real_verify(path)
        with (folder / name).open("ab") as f:
            f.write(b"\0")
        return problems

    monkeypatch.setattr(module, "verify", verify_then_change)
    assert main(["push", str(folder), "--quiet", "--repo", REPO]) == 1
    assert capsys.readouterr().err == f"error: {folder / name} changed since it was verified; not pushed\n"
    assert hub.requests == []
