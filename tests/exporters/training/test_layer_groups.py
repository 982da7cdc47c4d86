"""Layer groups stay bounded and ignore wrapper prefixes."""

from __future__ import annotations

from trainhealth._internal.exporters.training.layer_groups import group_parameters


def test_wrappers_are_ignored():
    names = ["module._orig_mod.embed.weight", "module._orig_mod.h.0._fsdp_wrapped_module.w", "_orig_mod.h.1.w"]
    assert group_parameters(names, 10).labels == ("embed", "h.0", "h.1")


def test_nested_numbered_containers_use_the_outer_block():
    names = ["blocks.2.experts.7.w1", "blocks.2.experts.3.w1", "blocks.3.norm.weight"]
    grouping = group_parameters(names, 10)
    assert grouping.labels == ("blocks.2", "blocks.3")
    assert grouping.index == (0, 0, 1)


def test_root_parameters_are_their_own_group():
    assert group_parameters(["pos_embedding", "layers.0.w"], 4).labels == ("pos_embedding", "layers.0")


def test_bounded_for_a_deep_model_with_two_stacks():
    names = [f"encoder.layers.{i}.w" for i in range(48)] + [f"decoder.layers.{i}.w" for i in range(48)]
    names += ["embed.weight", "lm_head.weight"]
    grouping = group_parameters(names, 16)
    assert len(grouping.labels) <= 16
    assert grouping.labels[0] == "encoder.layers.0-6"
    assert "embed" in grouping.labels and "lm_head" in grouping.labels
    assert len(grouping.index) == len(names)


def test_too_many_unnumbered_modules_fall_into_other():
    grouping = group_parameters([f"m{i}.w" for i in range(10)], 4)
    assert grouping.labels == ("m0", "m1", "m2", "other")
