"""`magi_lp.runtime.evaluations`: an evaluator's rows grouped into evaluations."""

from __future__ import annotations

from magi_lp.runtime.evaluations import group_evaluations


def _rows(*attempts: tuple[int, int]) -> list[dict]:
    """Rows of (point, episodes) attempts, as the CSV gives them (text)."""
    return [
        {"evaluation_at": str(at), "evaluation_episode": str(i + 1), "episode_return": "1"}
        for at, count in attempts
        for i in range(count)
    ]


def test_a_cut_evaluation_is_replaced_by_the_relaunchs_whole_one_and_shifts_nothing():
    # 0 whole; 100 cut after 1 of 3 episodes by a stop; the relaunch evaluates 100 again,
    # then 200. Runs of 3 rows, as before, mixed the cut attempt into every later one.
    rows = _rows((0, 3), (100, 1), (100, 3), (200, 3))
    got = group_evaluations(rows, 3)
    assert [(e.at, len(e.rows), e.complete) for e in got] == [
        (0, 3, True),
        (100, 3, True),
        (200, 3, True),
    ]
    assert got[1].rows == tuple(rows[4:7])


def test_a_cut_last_evaluation_is_kept_and_said_to_be_short():
    got = group_evaluations(_rows((0, 3), (100, 2)), 3)
    assert [(e.at, e.complete) for e in got] == [(0, True), (100, False)]


def test_two_evaluations_at_one_point_in_a_row_are_told_apart_by_their_episode_numbers():
    # A relaunch exactly at a point it had evaluated whole evaluates it again: the last counts.
    rows = _rows((100, 2), (100, 2))
    got = group_evaluations(rows, 2)
    assert len(got) == 1 and got[0].rows == tuple(rows[2:])


def test_rows_from_before_the_columns_come_in_runs_of_the_episodes():
    old = [{"episode_return": "1"} for _ in range(5)]
    got = group_evaluations(old + _rows((300, 2)), 2)
    assert [(e.at, len(e.rows), e.complete) for e in got] == [
        (None, 2, True),
        (None, 2, True),
        (None, 1, False),
        (300, 2, True),
    ]


def test_a_whole_evaluation_is_kept_when_a_later_attempt_at_its_point_is_cut():
    # Stopped exactly at 100 after evaluating it whole: the relaunch evaluates 100 again,
    # and a second stop cuts that one.
    rows = _rows((100, 3), (100, 1))
    got = group_evaluations(rows, 3)
    assert [(e.at, len(e.rows), e.complete) for e in got] == [(100, 3, True)]
    assert got[0].rows == tuple(rows[:3])


def test_an_evaluation_is_placed_at_its_first_count_but_never_before_its_point():
    def evaluation(at, *counts):
        rows = [{"evaluation_at": at, "evaluation_episode": i + 1, "actor_steps": c}
                for i, c in enumerate(counts)]  # fmt: skip
        (only,) = group_evaluations(rows, len(counts))
        return only.actor_steps

    assert evaluation(0, "", 4) == 0  # main.py's first: nothing counted yet
    assert evaluation(100, 104, 130) == 104  # the actors went on during the episodes
    assert evaluation(200, 0, 260) == 200  # a relaunch's redo before the counts came back
    assert evaluation(200, "", 260) == 200
    assert evaluation(200, 240, 260) == 240  # after: the relaunch's parameters


def test_a_cell_is_read_as_a_number_or_none():
    """A log's cells as the curves read them: a row a kill cut short, a column an older log
    lacks, or a value no count can be (NaN, an infinity) is None, not an error."""
    from magi_lp.runtime.evaluations import integer, number

    assert [number(v) for v in ("2.5", " 7 ", "1e3")] == [2.5, 7.0, 1000.0]
    assert [number(v) for v in ("", None, "abc")] == [None, None, None]
    assert [integer(v) for v in ("5.9", "-0.5", "40000.0")] == [5, 0, 40000]
    assert [integer(v) for v in ("", None, "nan", "inf", "-inf")] == [None] * 5
