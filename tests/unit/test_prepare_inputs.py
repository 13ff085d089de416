"""`python -m boost_titan.prepare` on corpora as users have them (issue 46): text under
another key (`--text-key`), gzip/bz2/xz/zstd files, another encoding (`--encoding`), lone
surrogates, and inputs that must be one `error:` line, exit 2 and nothing left in --out (an
empty result, a parquet without the text column, undecodable or damaged files). Every input
gives the same line, or the same bytes, at 1 and 2 workers."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from boost_titan import prepare
from boost_titan.data.documents import Chunk, Reading, documents
from boost_titan.data.tokenizer import load_tokenizer

LATIN = "café crème brûlée, naïve façade"


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """Keep the default tokenizer's cache out of the user's home."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def lines(records: list[object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def docs(n: int, word: str = "document") -> list[str]:
    return [f"{word} {i} " + "about foxes and shards " * (i % 7 + 1) for i in range(n)]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """prepare's main in this process: (exit status, stdout, stderr)."""
    try:
        prepare.main(["--tokenizer", "default", "--shard-mb", "0.001", *argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def prepared_twice(tmp_path: Path, capsys, *argv: str) -> tuple[dict, str]:
    """Prepare `argv` at 1 and 2 workers; the manifest and summary line, once the two
    folders are found byte-identical."""
    results = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        code, stdout, stderr = run(["--out", str(out), "--workers", str(workers), *argv], capsys)
        assert (code, stderr) == (0, ""), stderr
        results.append((folder_bytes(out), stdout))
    (one, line), (two, _) = results
    assert one == two
    return json.loads(one["manifest.json"]), line


def refused_twice(tmp_path: Path, capsys, *argv: str) -> str:
    """Prepare `argv` at 1 and 2 workers: exit 2, the same one `error:` line, nothing on
    stdout, and no --out folder left behind; the line."""
    errors = []
    for workers in (1, 2):
        out = tmp_path / f"refused{workers}"
        code, stdout, stderr = run(["--out", str(out), "--workers", str(workers), *argv], capsys)
        assert code == 2 and stdout == "", (code, stdout, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
        assert not out.exists(), sorted(p.name for p in out.rglob("*"))
        errors.append(stderr.replace(str(out), "OUT"))
    assert errors[0] == errors[1]
    return errors[0]


def test_text_under_another_key_is_named_with_text_key(tmp_path, capsys):
    corpus = tmp_path / "content.jsonl"
    corpus.write_text(lines([{"id": i, "content": d} for i, d in enumerate(docs(40))]))
    error = refused_twice(tmp_path, capsys, str(corpus))
    assert "none of the inputs' 40 records has text under 'text'" in error
    assert "the first record's keys: id, content; pass --text-key" in error
    manifest, line = prepared_twice(tmp_path, capsys, "--text-key", "content", str(corpus))
    assert manifest["documents"] + manifest["held_out_documents"] == 40
    assert manifest["text_keys"] == ["content"] and "skipped" not in line


def test_the_first_key_a_record_holds_wins(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        lines(
            [
                {"text": "from text", "content": "not this"},
                {"content": "from content"},
                {"text": None, "content": "null text falls through"},
                {"body": "no key"},
                {"text": "   ", "content": "a blank text is the text"},
            ]
        )
    )
    chunk = Chunk(str(path), 0, path.stat().st_size)
    got = list(documents(chunk, Reading(("text", "content"))))
    assert got == ["from text", "from content", "null text falls through"]
    assert list(documents(chunk, Reading(("content", "text")))) == [
        "not this",
        "from content",
        "null text falls through",
        "a blank text is the text",
    ]


def test_an_empty_result_is_an_error(tmp_path, capsys):
    blank = tmp_path / "blank.jsonl"
    blank.write_text(lines([{"text": " \n "}] * 30))
    error = refused_twice(tmp_path, capsys, str(blank))
    assert "would hold no tokens: the text of each of the inputs' 30 records is empty" in error
    held = tmp_path / "held.jsonl"  # one document, held out at 99%
    held.write_text(lines([{"text": "a lone document"}]))
    error = refused_twice(tmp_path, capsys, "--held-out-percent", "99.9", str(held))
    assert "every one of the 1 documents was held out (--held-out-percent 99.9)" in error


def test_a_parquet_without_the_text_column(tmp_path, capsys):
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"id": list(range(30)), "body": docs(30)}), folder / "x.parquet")
    error = refused_twice(tmp_path, capsys, str(folder))
    assert "x.parquet has no column 'text' (its columns: id, body); pass --text-key" in error
    manifest, _ = prepared_twice(tmp_path, capsys, "--text-key", "text,body", str(folder))
    assert manifest["documents"] + manifest["held_out_documents"] == 30


def test_lone_surrogates_become_the_replacement_character(tmp_path, capsys):
    corpus = tmp_path / "surrogates.jsonl"  # escapes that pair with nothing; one valid pair
    corpus.write_text(
        "".join(f'{{"text": "a \\ud800 b {i} \\udfff \\ud83d\\ude00"}}\n' for i in range(30))
    )
    manifest, line = prepared_twice(tmp_path, capsys, "--held-out-percent", "0", str(corpus))
    assert manifest["lone_surrogates"] == 60
    assert line.endswith(", 60 lone surrogates replaced by U+FFFD\n")
    tokenizer = load_tokenizer("default")
    want = [
        t
        for i in range(30)
        for t in tokenizer.encode(f"a \ufffd b {i} \ufffd \U0001f600", add_bos=True, add_eos=True)
    ]
    stream = b"".join(
        (tmp_path / "out1" / f"{s['name']}.bin").read_bytes() for s in manifest["shards"]
    )
    assert list(memoryview(stream).cast("H")) == want


def zstd_frames(text: str) -> bytes:
    """`text` as a zstd file of two frames (as `pzstd` and concatenated downloads write)."""
    data, compress = text.encode(), zstandard.ZstdCompressor().compress
    return compress(data[: len(data) // 2]) + compress(data[len(data) // 2 :])


COMPRESSED = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def test_compressed_files_read_as_their_plain_copies(tmp_path, capsys):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    files = {
        "a.jsonl": lines([{"text": d} for d in docs(40, "line")]),
        "b.json": json.dumps([{"text": d} for d in docs(20, "array")]),
        "c.txt": "\n\n".join(docs(25, "paragraph")) + "\n",
        "d.jsonl": lines([{"text": d} for d in docs(30, "bzip")]),
        "e.jsonl": lines([{"text": d} for d in docs(30, "xz")]),
        "f.jsonl": lines([{"text": d} for d in docs(30, "zstd")]),
        "g.txt": "\n\n".join(docs(20, "zstd paragraph")) + "\n",
    }
    compression = {"a.jsonl": ".gz", "b.json": ".gz", "c.txt": ".gz", "d.jsonl": ".bz2"}
    compression |= {"e.jsonl": ".xz", "f.jsonl": ".zst", "g.txt": ".zst"}
    for name, text in files.items():
        (plain / name).write_text(text)
        suffix = compression[name]
        packer = COMPRESSED.get(suffix, lambda data: zstd_frames(data.decode()))
        (packed / (name + suffix)).write_bytes(packer(text.encode()))
    want, _ = prepared_twice(tmp_path / "p", capsys, str(plain))
    got, _ = prepared_twice(tmp_path / "c", capsys, str(packed))
    assert len(got["shards"]) == 7  # a compressed file is one shard
    assert got["documents"] + got["held_out_documents"] == 195
    for key in ("tokens", "documents", "held_out_documents"):
        assert got[key] == want[key], key

    def stream(root: Path, manifest: dict) -> bytes:
        return b"".join((root / f"{s['name']}.bin").read_bytes() for s in manifest["shards"])

    assert stream(tmp_path / "c" / "out1", got) == stream(tmp_path / "p" / "out1", want)


def test_damaged_and_unread_compressed_files_are_one_line(tmp_path, capsys):
    text = lines([{"text": d} for d in docs(200)])
    good, frames = gzip.compress(text.encode()), zstd_frames(text)
    cases = {
        "not-gzip.jsonl.gz": (b"plain bytes", "is not a readable compressed file"),
        "cut.jsonl.gz": (good[: len(good) // 2], "is not a readable compressed file"),
        "not-zstd.jsonl.zst": (b"plain bytes", "is not a readable compressed file"),
        "cut.jsonl.zst": (frames[:-9], "stream ended before the end of its frame"),
        "x.jsonl.lz4": (b"\x04\x22\x4d\x18", "is lz4-compressed, which prepare does not read"),
        "x.parquet.gz": (b"PAR1", "parquet compresses its own columns"),
    }
    for name, (data, fragment) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert fragment in refused_twice(tmp_path, capsys, str(tmp_path / name)), name


def test_another_encoding_is_named_with_encoding(tmp_path, capsys):
    corpus = tmp_path / "latin.txt"
    corpus.write_bytes(f"{LATIN}\n\n{LATIN} encore\n".encode("latin-1"))
    error = refused_twice(tmp_path, capsys, str(corpus))
    assert "latin.txt is not utf-8 text" in error and "pass --encoding" in error
    jsonl = tmp_path / "latin.jsonl"
    jsonl.write_bytes(f'{{"text": "{LATIN}"}}\n'.encode("latin-1"))
    chunk = Chunk(str(jsonl), 0, jsonl.stat().st_size)
    assert list(documents(chunk, Reading(encoding="iso8859-1"))) == [LATIN]
    manifest, _ = prepared_twice(
        tmp_path, capsys, "--encoding", "latin-1", "--held-out-percent", "0", str(corpus)
    )
    assert manifest["encoding"] == "iso8859-1" and manifest["documents"] == 2
    text = Chunk(str(corpus), 0, corpus.stat().st_size)
    assert list(documents(text, Reading(encoding="iso8859-1"))) == [LATIN, f"{LATIN} encore"]


@pytest.mark.parametrize(
    "option, fragment",
    [
        (["--encoding", "utf-16"], "--encoding utf-16 is not ASCII-compatible"),
        (["--encoding", "klingon"], "--encoding 'klingon' is not an encoding Python knows"),
        (["--text-key", "text,,content"], "--text-key 'text,,content' holds an empty key"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, option, fragment):
    corpus = tmp_path / "a.jsonl"
    corpus.write_text(lines([{"text": d} for d in docs(5)]))
    assert fragment in refused_twice(tmp_path, capsys, *option, str(corpus))


def test_a_shard_appended_in_pieces_has_the_same_bytes(tmp_path, monkeypatch):
    """A worker appends its tokens to the shard file every FLUSH_TOKENS (a compressed file
    is one shard of any size): appending every 7 tokens writes the same folder."""
    from boost_titan.data import prepare_corpus as pc

    corpus = tmp_path / "a.jsonl.gz"
    corpus.write_bytes(gzip.compress(lines([{"text": d} for d in docs(60)]).encode()))
    plan = pc.make_plan([str(corpus)], "default")
    whole = pc.prepare(plan, str(tmp_path / "whole"))
    monkeypatch.setattr(pc, "FLUSH_TOKENS", 7)
    assert pc.prepare(plan, str(tmp_path / "pieces")) == whole
    assert whole["tokens"] > 100 * 7
    assert folder_bytes(tmp_path / "pieces") == folder_bytes(tmp_path / "whole")
