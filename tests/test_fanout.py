"""The interleaved fan-out study: every K timed in every round, a table from its CSV, bad arguments refused."""

from pal_bench import DEFAULT_FANOUT
from pal_bench.bench.tables import fanout_block
from pal_bench.studies import fanout


def test_every_fanout_is_timed_in_every_round(tmp_path):
    df = fanout.study(5_000, [4, DEFAULT_FANOUT], rounds=3, calls=2, progress=lambda m: None)
    assert len(df) == 2 * len(fanout.OPS) * 3
    assert (df.groupby(["round", "op"]).fanout.nunique() == 2).all()
    assert (df.us_per_call > 0).all()
    df.to_csv(tmp_path / "fanout.csv", index=False)
    text = fanout_block(tmp_path)
    assert "1 (default)" in text and "|   4 |" in text and "conditions not recorded" in text


def test_bad_arguments_are_refused(capsys):
    assert fanout.main(["--fanouts", "1,16", "--force"]) == 2
    assert fanout.main(["--rounds", "1", "--force"]) == 2
    assert "fan-outs must be >= 2" in capsys.readouterr().err
