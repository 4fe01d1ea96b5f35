"""The collector's pace that both replicas on the request path set when they start."""

import gc

from deployments.garbage_collection import YOUNGEST_THRESHOLD, collect_less_often


def test_the_youngest_generation_is_collected_less_often_and_the_older_keep_their_ratios():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        collect_less_often()
        assert gc.get_threshold() == (YOUNGEST_THRESHOLD, 10, 10)
        assert YOUNGEST_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)
