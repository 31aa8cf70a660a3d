import pytest

from helpers.units import SizeError, format_bytes, parse_size


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (20_497_743_674, "19.09 GiB"), (-2048, "-2.00 KiB"), (None, "not available"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("text, n", [
    ("1.5 GiB", 3 * 2**29), ("512MiB", 512 * 2**20), ("2 GB", 2_000_000_000),
    ("1048576", 2**20), (" 4 kib ", 4096), ("1e3", 1000), (77, 77), ("19.09GiB", 20_497_731_420),
])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["lots", "", "1.5 GiBs", "GiB", "-1 GiB", "0", 0, -5, True, 1.5,
                                 "1,5 GiB"])
def test_parse_size_rejects_with_clear_message(bad):
    with pytest.raises(SizeError) as info:
        parse_size(bad)
    msg = str(info.value)
    assert repr(bad) in msg or type(bad).__name__ in msg


def test_parse_size_allows_zero_when_asked():
    assert parse_size("0 B", allow_zero=True) == 0


def test_round_trip_is_close():
    for n in (1, 1000, 2**20 + 17, 19 * 2**30):
        assert abs(parse_size(format_bytes(n)) - n) <= max(1, n * 0.005)
