import torch

from helpers.show import fmt, fmt_scalar, fmt_sci, show, varies


def test_fixed_decimals_and_no_negative_zero():
    assert fmt_scalar(-0.00001, 4) == "0.0000"
    assert fmt_scalar(-0.0, 2) == "0.00"
    assert fmt_scalar(-0.634375, 6) == "-0.634375"
    assert fmt_scalar(float("nan")) == "nan" and fmt_scalar(float("-inf")) == "-inf"


def test_same_text_for_every_dtype_and_no_torch_noise():
    x = torch.tensor([[-0.4375, -0.875], [0.0, -0.0]], requires_grad=True) * 1
    texts = {fmt(x.to(dt), 4) for dt in (torch.float32, torch.float64)}
    assert texts == {"[[-0.4375, -0.8750],\n [ 0.0000,  0.0000]]"}
    assert "grad_fn" not in fmt(x) and "device" not in fmt(x)


def test_show_scalar_and_tensor(capsys):
    show("L", torch.tensor(0.19140625), 8)
    show("b", [1.0, -2.0], 1)
    show("n", 3, 2)
    assert capsys.readouterr().out == "L = 0.19140625\nb (2,)\n[ 1.0, -2.0]\nn = 3.00\n"


def test_long_dimensions_are_elided():
    text = fmt(torch.arange(20.0), 0, edge=2)
    assert text == "[ 0,  1, ..., 18, 19]"


def test_varies_prefix(capsys):
    varies("3.2 ms per step")
    assert capsys.readouterr().out == "[this run] 3.2 ms per step\n"


def test_fmt_sci_fixed_digits_and_no_negative_zero():
    assert fmt_sci(1.234e-7) == "1.2e-07" and fmt_sci(3e5, 2) == "3.00e+05"
    assert fmt_sci(0.000123456, 3) == "1.235e-04" and fmt_sci(5.0, 0) == "5e+00"
    assert fmt_sci(-0.0) == "0.0e+00" and fmt_sci(-2.5e-3) == "-2.5e-03"
    assert fmt_sci(float("nan")) == "nan" and fmt_sci(float("-inf")) == "-inf"
    assert fmt_sci(torch.tensor(1e-13, dtype=torch.float32)) == "1.0e-13"  # a 0-dim tensor
    # the same text for a float32 and a float64 value that round to the same digits
    assert fmt_sci(torch.tensor(0.1, dtype=torch.float32)) == fmt_sci(0.1) == "1.0e-01"


def test_fmt_sig_six_significant_digits_no_minus_zero():
    from helpers.show import fmt_sig

    assert fmt_sig(0.4) == "0.4" and fmt_sig(-0.923076923) == "-0.923077" and fmt_sig(1.5e-7) == "1.5e-07"
    assert fmt_sig(-1e-30, 2) == "-1e-30" and fmt_sig(-0.0) == "0"
    assert fmt_sig(float("nan")) == "nan" and fmt_sig(float("-inf")) == "-inf"
