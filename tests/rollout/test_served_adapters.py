"""The served names of one run's adapter versions: what a server's answer is mapped back to, and what it costs to keep
every version a long run loaded."""

import pytest

from trl_multiagent.adapters.routing import BASE_MODEL
from trl_multiagent.rollout.backends.served_adapters import ServedAdapters, other_run


def sync(served: ServedAdapters, adapters=None) -> dict[str, str]:
    names = {}
    for adapter in served.to_sync(adapters):
        names[adapter] = served.next_name(adapter)
        served.loaded(adapter, names[adapter])
    return names


def test_an_answer_names_the_adapter_and_optimizer_step_of_the_version_that_served_it():
    step = [0]
    served = ServedAdapters(["generator", "evaluator"], run="r1", weights_step=lambda: step[0])
    first = sync(served)
    step[0] = 7
    later = sync(served, ["generator"])

    assert served.provenance(first["generator"]).adapter == "generator"
    assert served.provenance(first["generator"]).version == 0
    assert served.provenance(later["generator"]).version == 7
    assert served.provenance(first["evaluator"]).version == 0
    assert served.provenance(first[BASE_MODEL]).version is None  # the zero adapter stands for the base model
    assert served.name_of("generator") == later["generator"]


def test_a_name_this_run_never_loaded_stays_as_it_is_and_names_its_run():
    served = ServedAdapters(["generator"], run="r1", weights_step=lambda: 3)
    names = sync(served)
    serial = names["generator"].rpartition(".")[2]
    for foreign in [f"generator@r2.{serial}", f"evaluator@r1.{serial}", "generator@r1.99", "generator", None]:
        provenance = served.provenance(foreign)
        assert (provenance.adapter, provenance.version) == (str(foreign), None)
        assert served.version_of(foreign) is None
    assert other_run(f"generator@r2.{serial}") == "r2"


def test_a_version_is_loaded_under_a_name_next_name_gave_it_once():
    served = ServedAdapters(["generator", "evaluator"], run="r1")
    with pytest.raises(ValueError, match="not a name that next_name gave"):
        served.loaded("generator", "generator@r1.5")
    name = served.next_name("generator")
    with pytest.raises(ValueError, match="not a name that next_name gave"):
        served.loaded("evaluator", name)
    served.loaded("generator", name)
    with pytest.raises(ValueError, match="not a name that next_name gave"):
        served.loaded("generator", name)


def test_a_load_that_failed_part_way_is_retried_under_a_new_name():
    served = ServedAdapters(["generator"], run="r1", weights_step=lambda: 4)
    failed = served.next_name("generator")  # some servers may hold it: the load raised before `loaded`
    retried = served.next_name("generator")
    assert retried != failed
    served.loaded("generator", retried)
    assert served.version_of(failed) is None  # never loaded everywhere: not this run's version
    assert served.version_of(retried) == ("generator", 4)


def test_a_day_of_weight_syncs_keeps_a_few_bytes_a_version():
    served = ServedAdapters(["generator", "evaluator"], run="r1", weights_step=lambda: 1)
    for _ in range(20_000):  # a day of 4-second steps
        sync(served)
    kept = served._adapter_of.buffer_info()[1] * served._adapter_of.itemsize
    kept += served._step_of.buffer_info()[1] * served._step_of.itemsize
    assert served.provenance("generator@r1.3").version == 1  # the second sync: serials 3 and 4
    assert kept / 40_001 <= 10  # two adapters a sync, and the zero adapter once
