import numpy as np

from draftwise.core.acceptance import accept, accept_greedy
from draftwise.core.tree import DraftTree


def test_greedy_longest_matching_path_plus_bonus():
    t = DraftTree.from_paths([[5, 6, 7], [5, 8]])  # tokens [5, 6, 8, 7]
    # root -> 5 (node 0), node 0 -> 6 (node 1), node 1 -> 7 (node 3), node 3 -> bonus 1
    argmax = np.array([5, 6, 7, 0, 1])  # rows: root, node 0, node 1, node 2, node 3
    assert accept_greedy(t, argmax) == ([0, 1, 3], 1)


def test_greedy_no_match_gives_one_token():
    t = DraftTree.chain([3, 4])
    assert accept_greedy(t, np.array([9, 4, 4])) == ([], 9)
    assert accept_greedy(DraftTree.empty(), np.array([2])) == ([], 2)


def test_accept_passes_path_so_far():
    t = DraftTree.chain([1, 2, 3])
    seen = []

    def emit(row, path):
        seen.append((row, list(path)))
        return [1, 2, 0, 0][row]

    assert accept(t, emit) == ([0, 1], 0)
    assert seen == [(0, []), (1, [0]), (2, [0, 1])]
