"""`python -m boost_titan.prepare` at any corpus size (issue 49): a task's payload does not
grow with the file count, a worker killed by SIGKILL ends the run in one line keeping the
finished shards, an overlong document is refused in one line, a full disk and a file as
`--out` are one line with no `.tmp` left, and the smaller refusals (`--workers 0`,
`--separator` with an EOS tokenizer) and a prepared folder among the inputs."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from boost_titan import prepare
from boost_titan.data import prepare_corpus as pc


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """Keep the default tokenizer's cache out of the user's home."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def jsonl(path: Path, n: int, words: int = 20) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(
        json.dumps({"text": f"doc {i} " + "shards of foxes " * (words + i % 5)}) + "\n"
        for i in range(n)
    )
    path.write_text(text)
    return path


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """prepare's main in this process: (exit status, stdout, stderr)."""
    try:
        prepare.main(["--tokenizer", "default", *argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(code: int, stdout: str, stderr: str) -> str:
    assert code == 2 and stdout == "", (code, stdout, stderr)
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    return stderr


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


def test_a_task_carries_the_same_bytes_at_any_file_count(tmp_path, monkeypatch):
    """What the parent pickles per message (chunk numbers, never the plan) is the same for 20
    files and for 1,000 (the plan grows 50 times)."""
    parent, sizes = os.getpid(), []
    dumps = ForkingPickler.dumps

    def measured(obj, protocol=None):
        data = dumps(obj, protocol)
        if os.getpid() == parent:
            sizes.append(len(data))
        return data

    largest = {}
    for files in (20, 1000):
        corpus = tmp_path / f"c{files}"
        corpus.mkdir()
        for i in range(files):
            (corpus / f"{i:05d}.jsonl").write_text(json.dumps({"text": f"fox {i}"}) + "\n")
        plan = pc.make_plan([str(corpus)], "default", held_out_percent=0)
        assert len(plan["chunks"]) == files
        out = tmp_path / f"out{files}"
        assert pc.pending(plan, str(out)) == list(range(files))
        sizes.clear()
        monkeypatch.setattr(ForkingPickler, "dumps", measured)
        done = [i for i, _ in pc.run_chunks(out, plan, list(range(6)), workers=2)]
        monkeypatch.setattr(ForkingPickler, "dumps", dumps)
        assert sorted(done) == list(range(6)) and sizes
        largest[files] = max(sizes)
    assert largest[1000] == largest[20] < 64, largest


def test_a_worker_killed_by_sigkill_ends_the_run_in_one_line(tmp_path, monkeypatch):
    """The test kills the worker tokenizing shard 2, the third of its batch of 4 tiny files
    (its pid read from a file it writes): the run ends within seconds naming shard 2's
    input, no `.tmp` is left, and the rerun writes the folder a one-worker run writes."""
    for i in range(12):
        jsonl(tmp_path / "corpus" / f"{i:02d}.jsonl", 3)
    plan = pc.make_plan([str(tmp_path / "corpus")], "default")
    monkeypatch.setattr(pc, "BATCH", 4)
    assert pc.batches(plan, list(range(12))) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    pc.prepare(plan, str(tmp_path / "whole"), workers=1)
    out, pid_file, tokenize = tmp_path / "out", tmp_path / "pid", pc._tokenize

    def stalls_on_two(f, index, plan):
        if index == 2:
            pid_file.write_text(str(os.getpid()))
            time.sleep(120)
        return tokenize(f, index, plan)

    def kill() -> None:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # (the pid is written)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        killed_at.append(time.monotonic())

    monkeypatch.setattr(pc, "_tokenize", stalls_on_two)
    todo, killed_at = pc.pending(plan, str(out)), []
    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    with pytest.raises(pc.Stopped) as stopped:
        for _ in pc.run_chunks(out, plan, todo, workers=2):
            pass
    killer.join()
    assert time.monotonic() - killed_at[0] < 10
    message = str(stopped.value)
    path, start, end = plan["chunks"][2]
    assert "\n" not in message and "was killed by SIGKILL" in message, message
    assert f"shard 2 ({path}, bytes {start}-{end})" in message, message
    assert "rerun the same command" in message
    assert temporaries(out) == [] and not (out / "shard-00002.json").exists()
    assert (out / "shard-00001.json").is_file()
    monkeypatch.setattr(pc, "_tokenize", tokenize)
    pc.prepare(plan, str(out), workers=2)
    assert folder_bytes(out) == folder_bytes(tmp_path / "whole")


def test_an_overlong_document_is_refused_in_one_line(tmp_path, capsys):
    """A line, a paragraph or a parquet text longer than --max-document-mb (here 0.1, read
    in chunks of 0.03 MB, so other chunks skip through it): one line naming
    the file (and where), nothing left in --out, at 1 and 2 workers."""
    line = tmp_path / "line" / "a.jsonl"
    jsonl(line, 5)
    offset = line.stat().st_size
    with open(line, "a") as f:
        f.write(json.dumps({"text": "fox " * 30_000}) + "\n")  # 120 KB
    jsonl(tmp_path / "line" / "b.jsonl", 3)
    paragraph = tmp_path / "para.txt"
    paragraph.write_text("a short one\n\n" + "many lines of foxes\n" * 6_000)  # 120 KB
    table = pa.table({"text": ["short", "fox " * 30_000]})
    pq.write_table(table, tmp_path / "t.parquet")
    cases = [
        (line.parent, f"{line} at byte {offset} holds a document longer"),
        (paragraph, f"{paragraph} at byte 13 holds a document longer"),
        (tmp_path / "t.parquet", f"{tmp_path / 't.parquet'} row group 0 holds a document"),
    ]
    for source, fragment in cases:
        for workers in ("1", "2"):
            out = tmp_path / f"out{workers}"
            argv = ["--out", str(out), "--workers", workers, "--max-document-mb", "0.1"]
            error = one_error(*run([*argv, "--shard-mb", "0.03", str(source)], capsys))
            assert fragment in error and "--max-document-mb 0.1;" in error, error
            assert not out.exists()
    code, _, stderr = run(
        ["--out", str(tmp_path / "ok"), "--max-document-mb", "0.2", str(line)], capsys
    )
    assert (code, stderr) == (0, "")


def test_a_full_disk_is_one_line_keeping_the_finished_shards(tmp_path, monkeypatch, capsys):
    """ENOSPC while shard 3 is written (simulated in-process: the workers are forked with
    the patched `_tokenize`): one line, exit 2, shards 0-2 kept, no `.tmp`; the rerun, with
    a lower --max-document-mb, finishes the folder with the bytes of an uninterrupted run."""
    corpus = jsonl(tmp_path / "a.jsonl", 60)
    argv = ["--shard-mb", "0.0005", "--held-out-percent", "10", str(corpus)]
    assert run(["--out", str(tmp_path / "whole"), "--workers", "1", *argv], capsys)[0] == 0
    tokenize = pc._tokenize

    def full_on_three(f, index, plan):
        if index == 3:
            f.write(b"\0" * 10)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return tokenize(f, index, plan)

    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        monkeypatch.setattr(pc, "_tokenize", full_on_three)
        error = one_error(*run(["--out", str(out), "--workers", workers, *argv], capsys))
        assert f"--out {out}: no room to write (No space left on device)" in error, error
        assert "rerun the same command" in error
        assert temporaries(out) == [] and (out / "plan.json").is_file()
        if workers == "1":
            assert {p.name for p in out.glob("shard-*.json")} == {
                f"shard-0000{i}.json" for i in range(3)
            }
        monkeypatch.setattr(pc, "_tokenize", tokenize)
        resume = ["--out", str(out), "--workers", workers, "--max-document-mb", "8", *argv]
        assert run(resume, capsys)[0] == 0  # (another cap resumes: it changes no shard)
        resumed, whole = folder_bytes(out), folder_bytes(tmp_path / "whole")
        manifest = json.loads(whole.pop("manifest.json")) | {"max_document_mb": 8.0}
        assert json.loads(resumed.pop("manifest.json")) == manifest
        assert resumed == whole


def test_the_smaller_refusals_are_one_line(tmp_path, capsys):
    corpus = jsonl(tmp_path / "a.jsonl", 5)
    (tmp_path / "file").write_text("x")
    cases = [
        (["--out", str(tmp_path / "file")], f"--out {tmp_path / 'file'} is a file, not a folder"),
        (["--out", str(tmp_path / "file" / "p")], "a folder on its path is a file"),
        (["--out", str(tmp_path / "o"), "--workers", "0"], "--workers 0 must be at least 1"),
        (
            ["--out", str(tmp_path / "o"), "--separator", "<|eos|>"],
            "--separator '<|eos|>': the tokenizer 'default' ends every document with its EOS",
        ),
        (["--out", str(tmp_path / "o"), "--max-document-mb", "0"], "must be positive"),
    ]
    for argv, fragment in cases:
        assert fragment in one_error(*run([*argv, str(corpus)], capsys))
    assert (tmp_path / "file").read_text() == "x" and not (tmp_path / "o").exists()


def test_a_prepared_folder_among_the_inputs_is_skipped(tmp_path, capsys):
    """A folder prepared inside the corpus tree (whole, or half written) is no input the
    next time: one line names it, and the result is the corpus's alone."""
    corpus = tmp_path / "corpus"
    jsonl(corpus / "a.jsonl", 20)
    assert run(["--out", str(tmp_path / "alone"), str(corpus)], capsys)[0] == 0
    assert run(["--out", str(corpus / "done"), str(corpus)], capsys)[0] == 0
    half = corpus / "half"
    assert run(["--out", str(half), "--shard-mb", "0.001", str(corpus)], capsys)[0] == 0
    (half / "manifest.json").rename(half / "plan.json")
    code, stdout, stderr = run(["--out", str(tmp_path / "again"), str(corpus)], capsys)
    assert code == 0 and stderr.count("\n") == 1, stderr
    assert "skipped 2 prepared folder(s) among the inputs" in stderr
    assert str(corpus / "done") in stderr and str(half) in stderr
    assert folder_bytes(tmp_path / "again") == folder_bytes(tmp_path / "alone")
