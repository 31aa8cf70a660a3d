import pytest

from helpers import allocation, gpu, plotting
from helpers.errors import BadInputError
from helpers.units import NOT_AVAILABLE


def test_plugin_options_read_like_jaxlib():
    assert allocation.plugin_options({})["options"]["allocator"] == "default"
    assert allocation.plugin_options(
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})["options"]["preallocate"] is False
    assert allocation.plugin_options(
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "FALSE"})["options"]["preallocate"] is True
    assert allocation.plugin_options(
        {"XLA_CLIENT_MEM_FRACTION": "0.3"})["options"]["memory_fraction"] == 0.3


def test_plugin_options_errors_come_back_as_data():
    both = allocation.plugin_options({"XLA_CLIENT_MEM_FRACTION": "0.5",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    assert both["error"].startswith("ValueError: XLA_CLIENT_MEM_FRACTION is specified together")
    bad = allocation.plugin_options({"XLA_PYTHON_CLIENT_ALLOCATOR": "turbo"})
    assert "turbo" in bad["error"]


def test_plugin_options_ignore_the_parents_settings(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # would conflict if inherited
    assert "error" not in allocation.plugin_options({"XLA_CLIENT_MEM_FRACTION": "0.2"})


def test_measurements_need_a_gpu():
    if gpu.why_unavailable() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(allocation.NoGpuError, match="needs an NVIDIA GPU"):
        allocation.measure()
    with pytest.raises(allocation.NoGpuError):
        allocation.measure_together()


def test_allocator_settings_plot():
    rows = [{"setting": "default", "ok": True, "total_bytes": 80 * 2**30,
             "driver_used_bytes": 60 * 2**30, "bytes_limit": 60 * 2**30,
             "bytes_in_use": 2**28},
            {"setting": "PREALLOCATE=false", "ok": False, "total_bytes": 80 * 2**30,
             "driver_used_bytes": None, "bytes_limit": None, "bytes_in_use": None}]
    fig = plotting.allocator_settings(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["default",
                                                            "PREALLOCATE=false (failed)"]
    assert ax.get_xlabel() == "GiB"
    with pytest.raises(ValueError):
        plotting.allocator_settings([])


@pytest.mark.gpu
@pytest.mark.beside_processes
def test_default_preallocates_and_false_does_not():
    d = allocation.measure("default")
    off = allocation.measure("PREALLOCATE=false")
    assert d.ok and off.ok, (d.error, off.error)
    assert 0.70 <= d.bytes_limit / d.total_bytes <= 0.76
    assert d.driver_used_bytes >= 0.70 * d.total_bytes
    assert off.driver_used_bytes < 0.25 * off.total_bytes
    assert 0.70 <= off.bytes_limit / off.total_bytes <= 0.76  # same cap, only not taken up front


GiB = 2**30


def test_predict_bfc_cap_does_not_depend_on_preallocate():
    on = allocation.predict({"allocator": "default"}, 24 * GiB)
    off = allocation.predict({"allocator": "default", "preallocate": False}, 24 * GiB)
    assert on.cap_bytes == off.cap_bytes == on.reported_limit == 18 * GiB  # 0.75 x 24 GiB
    assert on.upfront_bytes == 18 * GiB and off.upfront_bytes == 0
    assert not off.fits(allocation.STORY["request_bytes"], 24 * GiB)  # 19.09 GiB: still OOM


def test_predict_rounds_the_bfc_cap_up_to_2_mib():
    p = allocation.predict({"allocator": "bfc", "memory_fraction": 0.5}, 3 * 2**20 + 2)
    assert p.cap_bytes == 2 * 2**20  # 1.5 MiB + 1 byte rounds up to 2 MiB


def test_predict_platform_and_cuda_async_have_no_xla_cap():
    plat = allocation.predict({"allocator": "platform", "memory_fraction": 0.1}, 24 * GiB)
    assert plat.cap_bytes is None and plat.reported_limit is None and plat.upfront_bytes == 0
    assert plat.fits(20 * GiB, 24 * GiB) and not plat.fits(25 * GiB, 24 * GiB)
    lazy = allocation.predict({"allocator": "cuda_async", "preallocate": False}, 24 * GiB)
    assert lazy.cap_bytes is None and lazy.reported_limit == 0
    eager = allocation.predict({"allocator": "cuda_async", "memory_fraction": 0.5}, 24 * GiB)
    assert eager.upfront_bytes == eager.reported_limit == 12 * GiB


def test_predict_refuses_allocators_it_does_not_model():
    with pytest.raises(ValueError, match="does not model allocator 'vmm'"):
        allocation.predict({"allocator": "vmm"}, GiB)


def test_story_table_follows_jaxlib_then_xla():
    rows = {r["setting"]: r for r in allocation.story_table()}
    assert not rows["default"]["fits"] and not rows["PREALLOCATE=false"]["fits"]
    assert rows["MEM_FRACTION=0.9"]["fits"] and rows["ALLOCATOR=platform"]["fits"]
    assert rows["MEM_FRACTION=0.9"]["cap_bytes"] == 23194501120  # 0.9 x 24 GiB, 2 MiB-rounded
    caps = allocation.story_table({"FALSE": {"XLA_PYTHON_CLIENT_PREALLOCATE": "FALSE"}},
                                  request_bytes=GiB, total_bytes=8 * GiB)
    assert caps[0]["upfront_bytes"] == 6 * GiB and caps[0]["fits"]  # FALSE: still preallocates


@pytest.mark.gpu
@pytest.mark.beside_processes
def test_measured_limits_match_the_prediction():
    for name in ("default", "PREALLOCATE=false", "MEM_FRACTION=0.25"):
        m = allocation.measure(name)
        assert m.ok, m.error
        p = allocation.predict(allocation.plugin_options(allocation.SETTINGS[name])["options"],
                               m.total_bytes)
        assert abs(m.bytes_limit - p.reported_limit) <= 0.02 * m.total_bytes, (name, m, p)
    assert allocation.measure("ALLOCATOR=platform").bytes_limit is NOT_AVAILABLE  # no stats


@pytest.mark.parametrize("fraction", [100, 0, -0.5, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(BadInputError, match=r"outside \(0, 1\]"):
        allocation.predict({"memory_fraction": fraction}, 24 * 2**30)
    assert allocation.predict({"memory_fraction": 1.0}, 24 * 2**30).cap_bytes == 24 * 2**30


# --- the card you will run on ------------------------------------------------------------------
def test_cards_by_name_or_size():
    assert allocation.card("h100").name == "H100 80GB"
    assert allocation.card("RTX-3090").total_bytes == 24 * 2**30
    assert allocation.card("24 GiB").total_bytes == allocation.card(24 * 2**30).total_bytes
    with pytest.raises(BadInputError, match="names several cards"):
        allocation.card("a100")
    with pytest.raises(BadInputError, match="no card 'moon'; known: T4"):
        allocation.card("moon")


def test_the_storys_card_and_pool():
    """The seed: 19.09 GiB of tokens against the default pool of a 24 GiB RTX 3090."""
    t = allocation.target("RTX 3090")
    assert t.budget_bytes == 18 * 2**30 < allocation.STORY["request_bytes"]
    roomy = allocation.target("RTX 3090", fraction=0.9)
    assert roomy.budget_bytes > allocation.STORY["request_bytes"]


def test_processes_sharing_a_card():
    one = allocation.target("A100 80GB")
    two = allocation.target("A100 80GB", processes=2)
    assert two.budget_bytes == 80 * 2**30 - one.budget_bytes  # the other took its pool
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in two.note
    lazy = allocation.target("A100 80GB", preallocate=False, processes=2)
    assert lazy.budget_bytes == 40 * 2**30 and "equally" in lazy.note
    three = allocation.target("A100 80GB", processes=3)
    assert three.budget_bytes == 0  # 3 x 75% does not fit: this process gets nothing
    with pytest.raises(BadInputError, match="processes"):
        allocation.target("A100 80GB", processes=0)


def test_predict_refuses_plugin_options_whole_answer_rather_than_read_defaults():
    """A new user's trial: predict(plugin_options(env), total) read none of the settings inside
    {"options": ...} and answered JAX's defaults (75%, preallocated) for PREALLOCATE=false,
    MEM_FRACTION=.10. It refuses that now and says what to pass."""
    total = 24 * 2**30
    wanted = {"allocator": "default", "memory_fraction": 0.10, "preallocate": False}
    with pytest.raises(BadInputError, match=r"plugin_options\(env\)\['options'\]"):
        allocation.predict({"options": wanted}, total)
    with pytest.raises(BadInputError, match="jaxlib refused the settings: ValueError: bad"):
        allocation.predict({"error": "ValueError: bad"}, total)
    p = allocation.predict(wanted, total)
    assert (p.fraction, p.preallocate, p.upfront_bytes) == (0.10, False, 0)


def test_a_target_and_a_pool_print_their_answer_not_a_dataclass():
    """google/neural-tangents#204: nvidia-smi went from 426 to 61,352 of 81,920 MiB after one
    small call. A new user asked allocation.target('A100 80GB') and got a dataclass repr; the
    answer is a sentence now: the 60 GiB pool taken at the first allocation, and what
    PREALLOCATE=false changes (from jaxlib's options, not run on a GPU here)."""
    said = str(allocation.target("A100 80GB"))
    assert said.startswith("A100 80GB (80.00 GiB): 60.00 GiB for this process")
    assert "taken from the driver at the first allocation: 60.00 GiB" in said
    assert "what nvidia-smi shows as used" in said and "Target(" not in said
    lazy = str(allocation.predict({"preallocate": False}, 80 * 2**30))
    assert "nothing taken up front: it grows on demand" in lazy
    assert "PoolPrediction(" not in lazy
    plain = str(allocation.predict({"allocator": "platform"}, 80 * 2**30))
    assert plain.startswith("no pool: each buffer is its own cudaMalloc") and "up to" not in plain
