"""The timings' shortcuts for the shapes large jobs have (every rank running the same operations, sequence
numbers one after another, records in rank and step order, few transfer classes) give exactly what the general
computation gives: each is checked against the definition it replaces, on data with and without that shape."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainhealth._internal.localize import paths, timings
from trainhealth._internal.localize.compute_grid import grid_slots, median_along, versus_peers_and_own
from trainhealth._internal.localize.grouping import key_codes, median_by, positions
from trainhealth._internal.localize.localizer import Thresholds
from trainhealth._internal.localize.timings import gather_timings
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.scenario import Scenario, cluster_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth._internal.traces.topology import Topology

RNG = np.random.default_rng(5)


def _grouped_median(values: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """The definition: per value, the median of the values sharing every key (pandas groups them)."""
    return pd.Series(values).groupby(list(keys)).transform("median").to_numpy()


@pytest.mark.parametrize("replica_sizes", [(4, 4, 4), (4, 2, 3, 1)])  # every replica large; some of two or one
def test_dense_compute_medians_are_the_grouped_medians(replica_sizes):
    n_ranks, n_steps, slots = sum(replica_sizes), 6, 5
    grid = RNG.normal(size=(n_ranks, n_steps, slots))
    replica_of = np.repeat(np.arange(len(replica_sizes)), replica_sizes)
    peer_of = RNG.permutation(np.arange(n_ranks) % 3)  # peer groups of uneven sizes, not in rank order
    versus_peers, versus_own = versus_peers_and_own(grid, peer_of, replica_of)

    rank, step, slot = (a.reshape(-1) for a in np.meshgrid(*map(np.arange, grid.shape), indexing="ij"))
    values = grid.reshape(-1)
    assert np.array_equal(versus_peers.reshape(-1), values - _grouped_median(values, peer_of[rank], step, slot))
    own = values - _grouped_median(values, rank, slot)
    large = np.bincount(replica_of)[replica_of[rank]] >= 3
    common = np.where(
        large, _grouped_median(own, np.where(large, replica_of[rank], -1), step, slot), _grouped_median(own, step, slot)
    )
    assert np.array_equal(versus_own.reshape(-1), own - common)


@pytest.mark.parametrize("length", [1, 2, 3, 16, 128, 2000])  # sorted lanes up to 1024 values, np.median beyond
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_median_along_an_axis_is_numpys_median(length, axis):
    shape = [3, 4, 5]
    shape[axis] = length
    values = RNG.normal(size=shape)
    assert np.array_equal(median_along(values, axis), np.median(values, axis=axis))


def test_the_grid_is_recognised_only_when_every_cell_has_the_same_operations():
    cells, ops = 6, np.array([0, 0, 1, 2])
    rank_step, op_code, position = np.repeat(np.arange(cells), 4), np.tile(ops, cells), np.tile([0, 1, 0, 0], cells)
    assert grid_slots(rank_step, op_code, position, cells) == 4
    other = op_code.copy()
    other[-1] = 1  # the last cell ran another operation in its last slot
    assert grid_slots(rank_step, other, position, cells) is None
    assert grid_slots(rank_step[:-4], op_code[:-4], position[:-4], cells) is None  # a cell without operations


@pytest.mark.parametrize("groups", [7, 5000])  # few classes: sorted and sliced; many: grouped
def test_medians_by_key_are_pandas_medians(groups):
    key = RNG.integers(0, 10**9, groups)[RNG.integers(0, groups, 20_000)]
    values = RNG.normal(size=len(key))
    assert np.array_equal(median_by(values, key), _grouped_median(values, key))


@pytest.mark.parametrize("limit", [100, 10**8])  # keys filling their range: a table; sparse: hashed
def test_key_codes_number_the_distinct_keys_in_order(limit):
    key = RNG.integers(0, limit, 1000)
    assert np.array_equal(key_codes(key, limit), pd.factorize(key, sort=True)[0])


@pytest.mark.parametrize("gaps", [False, True])
def test_positions_count_a_groups_instances_in_its_step_by_sequence_number(gaps):
    group, step = np.repeat([0, 1, 2], 8), np.tile(np.repeat([0, 1], 4), 3)
    seq = np.tile(np.arange(8), 3) * (3 if gaps else 1)  # every third number: not one after another
    order = RNG.permutation(len(seq))
    group, step, seq = group[order], step[order], seq[order]
    expected = pd.Series(seq).groupby([group, step]).rank(method="first").to_numpy().astype(int) - 1
    assert np.array_equal(positions(group, step, seq), expected)


def test_spans_do_not_depend_on_the_order_records_come_in():
    rank, step = np.repeat(np.arange(4), 30) % 4, np.tile(np.repeat(np.arange(3), 10), 4)
    start, duration = RNG.uniform(0, 100, len(rank)), RNG.uniform(0, 1, len(rank))
    in_order = timings._spans(rank, step, start, duration, 4, 3)  # rank by rank, step by step
    shuffled = RNG.permutation(len(rank))
    anyhow = timings._spans(rank[shuffled], step[shuffled], start[shuffled], duration[shuffled], 4, 3)
    assert all(np.array_equal(a, b) for a, b in zip(in_order, anyhow))


def test_first_memberships_in_parts_are_pandas_first_occurrences():
    instance, component = RNG.integers(0, 500, 5000), RNG.integers(0, 6, 5000)
    expected = ~pd.Series(instance * 6 + component).duplicated().to_numpy()
    assert np.array_equal(paths._first_memberships(instance, component, 6, part=64), expected)


def test_a_layer_scored_with_transfers_explained_sums_only_the_open_ones():
    layout = ClusterLayout(dp=4, pp=4, tp=4, hosts_per_leaf=2)
    trace = simulate(Scenario(layout, steps=20, seed=3, faults=(cluster_fault(layout, "nic", 21, 1.3, step=6),)))
    topology = Topology.from_dict(trace.topology)
    found = gather_timings(trace.records, topology.hosts, topology.switches)
    transfers, thresholds = found.transfers, Thresholds()
    for layer in paths._layers(found):
        explained = RNG.random(len(transfers.excess)) < 0.2
        _, _, values = paths._score_layer(found, layer, explained, thresholds, {})
        open_pairs = ~explained[layer.instance]
        size = len(layer.labels) * len(found.steps)
        cell, weights = layer.cell[open_pairs], transfers.excess[layer.instance[open_pairs]]
        sums = np.bincount(cell, weights=weights, minlength=size).reshape(len(layer.labels), -1)
        counts = np.bincount(cell, minlength=size).reshape(len(layer.labels), -1)
        with np.errstate(invalid="ignore", divide="ignore"):
            assert np.array_equal(values, np.where(counts > 0, sums / counts, np.nan), equal_nan=True), layer.name
