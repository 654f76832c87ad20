from trl_es.trainer.sampler import EpochSeededRepeatSampler


def make_sampler():
    return EpochSeededRepeatSampler(data_source=list(range(12)), mini_repeat_count=1, batch_size=4, seed=7)


def test_each_epoch_order_depends_only_on_seed_and_epoch():
    uninterrupted = make_sampler()
    orders = []
    for epoch in range(3):
        uninterrupted.set_epoch(epoch)
        orders.append(list(uninterrupted))
    resumed = make_sampler()
    resumed.set_epoch(2)  # what the Trainer does when it resumes in epoch 2
    assert list(resumed) == orders[2]
    assert orders[0] != orders[1] != orders[2]
    assert sorted(orders[1]) == list(range(12))
