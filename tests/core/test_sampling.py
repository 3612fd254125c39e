import numpy as np
import pytest

from draftwise.core.sampling import SamplingParams, apply_repetition_penalty, next_token, probabilities, sample
from draftwise.errors import DraftwiseError

E = np.array([], np.int64)


def test_greedy_and_penalty():
    x = np.array([1.0, 3.0, 2.9], np.float32)
    assert next_token(x, E, SamplingParams(), 0.5) == 1
    p = SamplingParams(repetition_penalty=1.5)
    assert next_token(x, np.array([1]), p, 0.5) == 2
    y = apply_repetition_penalty(np.array([-2.0, 2.0]), np.array([0, 1]), 2.0)
    assert y.tolist() == [-4.0, 1.0]


def test_filters():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    np.testing.assert_allclose(probabilities(x, E, SamplingParams(temperature=1.0)), [0.5, 0.3, 0.15, 0.05])
    p = probabilities(x, E, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    p = probabilities(x, E, SamplingParams(temperature=1.0, top_p=0.8))
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    p = probabilities(x, E, SamplingParams(temperature=1.0, top_p=0.81))
    assert np.count_nonzero(p) == 3
    p = probabilities(x, E, SamplingParams(temperature=1.0, min_p=0.5))
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    hot = probabilities(x, E, SamplingParams(temperature=100.0))
    assert hot.max() - hot.min() < 0.01


def test_sample_inverts_cdf():
    p = np.array([0.25, 0.25, 0.5])
    assert [sample(p, u) for u in (0.0, 0.24, 0.26, 0.49, 0.51, 0.999)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=1), dict(top_k=-2),
     dict(repetition_penalty=0), dict(temperature=float("nan"))],
)
def test_bad_params(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(DraftwiseError, match=name):
        SamplingParams(**kwargs)
