"""The interleaved fan-out study: every K timed in every round, a table from its CSV, bad arguments refused."""

import pytest

from pal_bench import DEFAULT_FANOUT
from pal_bench.studies import fanout
from pal_bench.studies.fanout import fanout_block


def test_every_fanout_is_timed_in_every_round(tmp_path):
    df = fanout.study(5_000, [4, DEFAULT_FANOUT], rounds=3, calls=2, progress=lambda m: None)
    assert len(df) == 2 * len(fanout.OPS) * 3
    assert (df.groupby(["round", "op"]).fanout.nunique() == 2).all()
    assert (df.us_per_call > 0).all()
    df.to_csv(tmp_path / "fanout.csv", index=False)
    text = fanout_block(tmp_path)
    assert "1 (default)" in text and "|   4 |" in text and "conditions not recorded" in text


@pytest.mark.parametrize("argv, message", [(["--fanouts", "1,16"], "argument --fanouts: must be >= 2, got '1'"),
                                           (["--rounds", "1"], "argument --rounds: must be >= 2, got '1'")])
def test_bad_arguments_are_refused(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        fanout.main([*argv, "--force"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
