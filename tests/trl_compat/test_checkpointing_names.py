"""Activation checkpointing turned off and back on around a forward under the names the installed transformers reads
without a warning: transformers 5.25 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns at
each use of the old names, which TRL 1.16's ``disable_gradient_checkpointing`` still reads (three warnings a forward);
5.3 to 5.24 have only the old names."""

from __future__ import annotations

import warnings

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from trl_multiagent.seams.transformers import checkpointing_off, checkpointing_on


@pytest.fixture
def model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))


def test_checkpointing_goes_off_and_comes_back_with_the_runs_kwargs_without_a_warning(model):
    layers = model.get_base_model().model.layers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert checkpointing_on(model)
        with checkpointing_off(model, {"use_reentrant": False}):
            assert not checkpointing_on(model)
            assert not any(layer.gradient_checkpointing for layer in layers)
        assert checkpointing_on(model)
    assert all(layer.gradient_checkpointing for layer in layers)
    assert "use_reentrant=False" in repr(layers[0]._gradient_checkpointing_func)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def test_a_model_without_checkpointing_is_left_as_it_was(model):
    model.get_base_model().gradient_checkpointing_disable()
    with checkpointing_off(model, {"use_reentrant": False}):
        assert not checkpointing_on(model)
    assert not checkpointing_on(model)
