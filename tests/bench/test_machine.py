"""The machine's ceilings (`bench.machine`) are best-of, as the steps they divide are."""


def test_a_ceiling_is_timed_by_its_fastest_call():
    """Both ceilings (matmul FLOP/s and read bytes/s) time each call alone and keep the
    fastest: a mean over calls would count the machine's slow moments against the ceiling
    that the best-of step times are divided by."""
    from jaxrl_llm.bench.machine import fastest_call_s

    durations, now = iter([3.0, 1.0, 2.0, 5.0, 4.0]), [0.0]

    def call() -> None:
        now[0] += next(durations)

    assert fastest_call_s(call, 5, clock=lambda: now[0]) == 1.0
