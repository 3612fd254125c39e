import numpy as np
import pytest

from draftwise.core.tree import DraftTree, TreeBuilder, merge_trees
from draftwise.errors import DraftwiseError


def test_from_paths_dedups_shared_prefixes_in_bfs_order():
    t = DraftTree.from_paths([[5, 6, 7], [5, 8], [9]])
    assert t.tokens.tolist() == [5, 9, 6, 8, 7]
    assert t.parents.tolist() == [-1, -1, 0, 0, 2]
    assert t.depth.tolist() == [1, 1, 2, 2, 3]
    assert t.max_depth == 3


def test_budget_keeps_shallow_nodes_and_valid_parents():
    t = DraftTree.from_paths([[1, 2, 3, 4], [1, 5, 6], [7, 8]], budget=4)
    assert len(t) == 4
    assert t.tokens.tolist() == [1, 7, 2, 5]
    assert all(p < i for i, p in enumerate(t.parents.tolist()))


def test_masks_and_positions():
    t = DraftTree.from_paths([[5, 6, 7], [5, 8]])
    anc = t.ancestor_mask()
    # node 3 (token 7) sees 5, 6 and itself, not 8
    assert anc[3].tolist() == [True, True, False, True]
    m = t.verify_mask()
    assert m.shape == (5, 5) and m[:, 0].all()
    assert m[0].tolist() == [True, False, False, False, False]
    assert t.verify_positions().tolist() == [0, 1, 2, 2, 3]


def test_chain_and_path():
    t = DraftTree.chain([4, 4, 4])
    assert t.is_chain() and t.path_to(2) == [0, 1, 2]
    assert not DraftTree.from_paths([[1], [2]]).is_chain()
    assert len(DraftTree.empty()) == 0 and DraftTree.empty().verify_mask().shape == (1, 1)


def test_bad_parents_rejected():
    with pytest.raises(DraftwiseError, match="earlier nodes"):
        DraftTree(np.array([1, 2]), np.array([1, -1]))
    with pytest.raises(DraftwiseError, match="as many parents"):
        DraftTree(np.array([1, 2]), np.array([-1]))


def test_builder_limit_and_completion():
    b = TreeBuilder()
    end, complete = b.add_path(-1, [1, 2, 3], limit=2)
    assert (end, complete, len(b)) == (1, False, 2)
    end, complete = b.add_path(-1, [1, 2], limit=2)  # already there: no new nodes needed
    assert (end, complete) == (1, True)


def test_random_trees_mask_matches_paths():
    rng = np.random.default_rng(0)
    for _ in range(20):
        paths = [rng.integers(0, 4, rng.integers(1, 6)).tolist() for _ in range(5)]
        t = DraftTree.from_paths(paths)
        anc = t.ancestor_mask()
        for i in range(len(t)):
            assert set(np.flatnonzero(anc[i]).tolist()) == set(t.path_to(i))
        # every input path is present as a root-to-node path
        for p in paths:
            node = -1
            for tok in p:
                hits = np.flatnonzero((t.parents == node) & (t.tokens == tok))
                assert hits.size == 1
                node = int(hits[0])


def test_merge_trees_is_the_union_of_paths_first_tree_wins() -> None:
    """Random trees: every input path once, sources from the first tree holding it,
    breadth-first order, and a budget keeps the shallowest nodes."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        trees = [
            DraftTree.from_paths([rng.integers(0, 3, rng.integers(1, 5)).tolist() for _ in range(4)])
            for _ in range(3)
        ]
        m = merge_trees(trees)

        def paths(t: DraftTree) -> list[tuple[int, ...]]:
            return [tuple(t.tokens[t.path_to(i)].tolist()) for i in range(len(t))]

        want: dict[tuple[int, ...], int] = {}
        for k, t in enumerate(trees):
            for p in paths(t):
                want.setdefault(p, k)
        got = paths(m)
        assert sorted(got) == sorted(want) and [want[p] for p in got] == m.source.tolist()
        assert np.all(np.diff(m.depth) >= 0)
        cut = merge_trees(trees, budget=5)
        assert paths(cut) == got[:5]
