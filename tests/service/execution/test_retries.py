"""What the runner runs again after Tune's round (issue 46), from the texts Tune writes of a trial's failures: the
death of a trial's process or node is retried within --max-failures, counted once per dead process; a trial's own
error is not. (The retries themselves run on Ray in test_faults.py and test_chaos.py.)"""

from __future__ import annotations

import ray.exceptions

from ablate.service.execution.retries import LOST, NODE_DIED, PROCESS_DIED, Retries, death_of, failure_reason

#: Tune's error.txt of a trial handed to an actor that died (its text as Ray 2.60 writes it: no class name), failed
#: twice by that one death: Tune retried it on the same dead cached actor.
ACTOR_DIED_TWICE = "".join(
    f"Failure # {n} (occurred at 2026-11-29_09-13-56)\nThe actor died unexpectedly before finishing this task.\n"
    "\tclass_name: with_resources.<locals>.ResourceTrainable\n\tpid: 11701\n\tip: 192.0.2.2\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR\n"
    for n in (1, 2)
)
NODE_LOST = (
    "Failure # 1 (occurred at 2026-11-29)\nThe actor died because its node has died. Node Id: 8a9f\n\tpid: 4242\n"
)
OWN_ERROR = (
    "Failure # 1 (occurred at 2026-11-29)\nray::ResourceTrainable.train() (pid=3131, ip=127.0.0.1)\n"
    'Traceback (most recent call last):\n  File "faulty.py", line 40, in _report\n'
    "tests.service.execution.faulty.InjectedFault: injected fault at step 7 (1 of 10)\n"
)


def test_the_death_of_a_process_or_node_is_told_from_a_trials_own_error():
    assert death_of(ACTOR_DIED_TWICE) == PROCESS_DIED
    assert death_of(NODE_LOST) == NODE_DIED
    assert death_of(OWN_ERROR) is None and failure_reason(OWN_ERROR) == "it raised InjectedFault"
    assert death_of(OWN_ERROR + ACTOR_DIED_TWICE.replace("Failure # 1", "Failure # 2")) == PROCESS_DIED  # the last
    assert death_of(ray.exceptions.ActorDiedError()) == PROCESS_DIED  # as the result grid hands it back
    assert death_of(ray.exceptions.NodeDiedError("node 8a9f")) == NODE_DIED
    assert death_of(ValueError("bad plugin")) is None and failure_reason(ValueError("x")) == "it raised ValueError"


def test_retries_are_bounded_by_max_failures_over_all_rounds_one_dead_process_once():
    retries = Retries(max_failures=2)
    # round 1: a died twice by one death (one failure), b raised, c was left unfinished by Tune with no error
    again = retries.again({"a", "b", "c"}, {"a": (2, ACTOR_DIED_TWICE), "b": (3, OWN_ERROR)})
    assert again == {"a", "c"} and retries.failures == {"a": 1, "b": 3, "c": 1}
    assert retries.retried == {"a": [PROCESS_DIED], "c": [LOST]}
    assert retries.again({"a"}, {"a": (1, NODE_LOST)}) == {"a"}  # its second failure: still within 2
    assert retries.again({"a"}, {"a": (1, NODE_LOST)}) == set()  # its third is past --max-failures 2
    assert retries.retried["a"] == [PROCESS_DIED, NODE_DIED] and retries.failures["a"] == 3
    assert Retries(max_failures=0).again({"a"}, {"a": (1, ACTOR_DIED_TWICE)}) == set()
