"""Parents the search tests share: stories260K (the CI model) and a tiny random Llama with groups and act-order."""

import pytest

import matgptq
from tests.conftest import STORIES, TINYSTORIES


@pytest.fixture(scope="session")
def stories_parent(tmp_path_factory):
    """stories260K as a MatGPTQ parent with R = {2,3,4,6,8} (c = 8), calibrated on 32 × 128 TinyStories tokens in
    float32 (auto would take bfloat16 passes on a CPU with bfloat16 arithmetic, and another parent)."""
    out = tmp_path_factory.mktemp("search") / "stories-parent"
    matgptq.quantize(
        STORIES,
        out,
        calib=TINYSTORIES,
        calib_range=(0.6, 1.0),
        method="matgptq",
        bits=(2, 3, 4, 6, 8),
        nsamples=32,
        seqlen=128,
        dtype="float32",  # the same arithmetic on every CPU: data/search_before.json's mixes were searched on it
        progress=False,
    )
    return out


@pytest.fixture(scope="module")
def stories_fitness(stories_parent):
    """The fitness of stories_parent (every layer at 8 bits) on 6 × 64 TinyStories tokens, batches of 4."""
    from matgptq.allocation.fitness import Fitness
    from matgptq.evaluation.teacher import Teacher
    from matgptq.formats import read_checkpoint
    from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize

    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.7))), 6, 64, 0)
    teacher = Teacher(matgptq.load(STORIES), windows, batch_size=4)
    names = tuple(read_checkpoint(stories_parent).layers)
    yield Fitness(matgptq.load(stories_parent, bits=8), teacher, windows, names, batch_size=4)
    teacher.close()


@pytest.fixture(scope="session")
def grouped_parent(tiny_llama_dir, tmp_path_factory):
    """A tiny parent with 32-column groups and act-order (so its slices store `perm`)."""
    out = tmp_path_factory.mktemp("search") / "grouped-parent"
    matgptq.quantize(
        tiny_llama_dir,
        out,
        calib=TINYSTORIES,
        calib_range=(0.9, 1.0),
        method="matgptq",
        bits=(3, 4, 8),
        nsamples=8,
        seqlen=64,
        group_size=32,
        act_order=True,
        static_groups=False,
        progress=False,
    )
    return out
