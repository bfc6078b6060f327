import math

import pytest

from mars.errors import ConfigError
from mars.train.config import ScheduleConfig
from mars.train.schedule import LRSchedule


@pytest.mark.parametrize("name", ["cosine", "linear", "wsd", "constant"])
def test_warmup_is_the_reference_loops(name):
    """lr = peak * step / warmup for step < warmup (train_mars.py's get_lr): step 0 runs at lr 0,
    the peak comes at step `warmup`, and every schedule shares this warmup."""
    s = LRSchedule(name, warmup_steps=4, decay_steps=20, min_factor=0.1)
    assert [s(i) for i in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert s(4) == 1.0  # the first step after warmup is the peak, where the decay starts


def test_cosine_decays_to_min_and_stays_there():
    s = LRSchedule("cosine", warmup_steps=0, decay_steps=100, min_factor=0.1)
    assert s(0) == pytest.approx(1.0)
    assert s(50) == pytest.approx(0.1 + 0.5 * 0.9)  # half way: mean of peak and floor
    assert s(25) == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi / 4)) * 0.9)
    assert s(100) == pytest.approx(0.1)
    assert s(250) == pytest.approx(0.1)


def test_linear_decay():
    s = LRSchedule("linear", warmup_steps=10, decay_steps=110, min_factor=0.0)
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.5)
    assert s(110) == pytest.approx(0.0)


def test_wsd_holds_then_decays_over_the_last_fraction():
    s = LRSchedule("wsd", warmup_steps=10, decay_steps=110, min_factor=0.2, decay_fraction=0.2)
    # stable until 110 - 0.2 * 100 = 90, then linear to 0.2 at 110
    assert [s(i) for i in (10, 50, 89, 90)] == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert s(100) == pytest.approx(0.6)
    assert s(110) == pytest.approx(0.2)
    assert s(500) == pytest.approx(0.2)


def test_constant_after_warmup():
    s = LRSchedule("constant", warmup_steps=3, decay_steps=10, min_factor=0.5)
    assert [s(i) for i in (0, 2, 3, 9, 1000)] == pytest.approx([0.0, 2 / 3, 1.0, 1.0, 1.0])


def test_from_config_turns_absolute_min_lr_into_a_factor():
    cfg = ScheduleConfig(name="cosine", warmup_steps=0, min_lr=6e-4, decay_steps=None)
    s = LRSchedule.from_config(cfg, base_lr=6e-3, max_steps=200)
    assert s.decay_steps == 200
    assert s(200) == pytest.approx(0.1)
    cfg.decay_steps = 100
    assert LRSchedule.from_config(cfg, base_lr=6e-3, max_steps=200)(100) == pytest.approx(0.1)


def test_unknown_schedule_and_min_lr_above_lr_are_config_errors():
    with pytest.raises(ConfigError, match="schedule.name='cos'"):
        LRSchedule("cos", warmup_steps=0, decay_steps=10)
    with pytest.raises(ConfigError, match="min_lr"):
        LRSchedule("cosine", warmup_steps=0, decay_steps=10, min_factor=2.0)
