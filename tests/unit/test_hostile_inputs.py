"""Issue 46's hostile prepared data, tokenizers and TOMLs (`scripts/hostile_inputs.py`,
which also times each under `/usr/bin/time -v` for docs/reliability.md), each through
`python -m boost_titan.check`, all in one child: one `error:` line naming what is wrong,
exit 2; the legitimate ones (the clean folder, a blend whose weights overflow their sum)
pass. The blend's shares, and the loader's token-id check, are tested here too. The
seeded fuzzer over the same readers: `test_input_fuzz.py`."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from boost_titan.config.errors import ConfigError
from boost_titan.data import prepare_corpus
from boost_titan.data.mix import MixedWindows, MixSource, normalized, open_sources
from boost_titan.data.prepared import PreparedDataset
from scripts import hostile_inputs
from tests.helpers.commands import assert_one_error, check_each


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A folder `python -m boost_titan.prepare` wrote with the default tokenizer (cached
    where test_prepared.py caches it), in several shards, with held-out documents."""
    root = tmp_path_factory.mktemp("hostile-inputs")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while data shards blend".split()
    lines = [json.dumps({"text": " ".join(rng.choices(words, k=40))}) for _ in range(200)]
    (corpus / "a.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        plan = prepare_corpus.make_plan(
            [str(corpus)], "default", chunk_mb=0.01, held_out_percent=10
        )
        prepare_corpus.prepare(plan, str(root / "prepared"))
        yield root / "prepared"


@pytest.fixture(scope="module")
def checked(prepared, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("cases")
    argvs = [hostile_inputs.build(name, prepared, scratch) for name in hostile_inputs.CASES]
    return dict(zip(hostile_inputs.CASES, check_each(argvs, scratch), strict=True))


@pytest.mark.parametrize("name", list(hostile_inputs.CASES))
def test_each_hostile_input_is_one_line(checked, name):
    result, fragment = checked[name], hostile_inputs.CASES[name][1]
    assert "Traceback" not in result.stdout, result.stdout
    if not fragment:
        assert result.returncode == 0, result.stdout
        assert result.stdout.startswith("config ok:"), result.stdout
        return
    assert result.returncode == 2, result.stdout
    assert_one_error(result, fragment)


def test_a_blend_whose_weights_overflow_their_sum_keeps_their_ratio(prepared, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(prepared, other)
    sources = [MixSource("big", str(prepared), 1.7e308), MixSource("small", str(other), 0.17e308)]
    assert normalized([1.7e308, 0.17e308]) == pytest.approx([10 / 11, 1 / 11], rel=1e-12)
    mixed = MixedWindows(sources, open_sources(sources), 8, local_batch_size=11)
    for _ in zip(range(110), mixed, strict=False):
        pass
    assert mixed.taken == [100, 10]


def test_the_loader_refuses_a_shard_with_an_id_past_the_vocabulary(prepared, tmp_path):
    """The id check runs on each window the loader reads, whatever `check` read before."""
    folder = tmp_path / "p"
    shutil.copytree(prepared, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    last = folder / f"{manifest['shards'][-1]['name']}.bin"
    data = bytearray(last.read_bytes())
    data[:2] = (4096).to_bytes(2, "little")  # the vocabulary is 0..4095
    last.write_bytes(bytes(data))
    dataset = PreparedDataset(str(folder))
    dataset.read(0, dataset.starts[-2])  # every shard but the last: fine
    with pytest.raises(ConfigError, match="holds token id 4096, past the manifest's vocab_size"):
        dataset.read(dataset.starts[-2], 1)


def test_the_memory_line_names_where_the_values_came_from(tmp_path):
    """A value set on the command line is not said to come from the TOML."""
    from boost_titan.check import memory_line
    from boost_titan.config.cli import job_source, parse_job_config
    from tests.helpers import DEBUG_TOML

    args = ["--job.config_file", str(DEBUG_TOML), "--model.name", "llama3"]
    line = memory_line(parse_job_config(args), 2, job_source(args))
    assert f"model.name 'llama3' in {DEBUG_TOML} and the command line:" in line, line
    assert job_source(["--job.config_file", "x.toml"]) == "x.toml"
    assert job_source(["--training.steps", "3"]) == "the command line"


def test_a_worker_started_without_check_refuses_a_nonsense_number():
    """`torchrun -m boost_titan.train` runs no `check`: the worker refuses it before it
    builds the trainer."""
    from boost_titan.config.cli import parse_job_config
    from boost_titan.job.entry import train
    from tests.helpers import DEBUG_TOML

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), "--optimizer.lr", "nan"])
    with pytest.raises(ConfigError, match="optimizer.lr nan is outside the sane range"):
        train(lambda job: pytest.fail("the trainer was built"), job)
