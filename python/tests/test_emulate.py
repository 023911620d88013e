"""`gpumemhook.cards()` and `gpumemhook.emulate()`: a card is chosen before the program starts
(``GPUMEMHOOK_EMULATE``); asking from inside says so, and the NVML helpers see the emulated card."""

import gpumemhook
import pytest

T4 = 15360 << 20


def test_cards_come_from_the_one_table():
    by_name = {c["name"]: c for c in gpumemhook.cards()}
    assert by_name["t4"]["total"] == T4
    assert by_name["a100-80gb"]["total"] == 81920 << 20
    totals = [c["total"] for c in gpumemhook.cards()]
    assert totals == sorted(totals)


def test_unknown_cards_and_zero_are_refused_listing_the_cards():
    for bad in ["t5", "0", "0GiB", ""]:
        with pytest.raises(ValueError) as e:
            gpumemhook.emulate(bad)
        assert "t4" in str(e.value) and "a100-80gb" in str(e.value)


def test_emulate_after_start_raises_naming_the_variable(runner):
    out = runner.run(
        """
        import gpumemhook
        malloc(1000)
        try:
            gpumemhook.emulate("t4")
        except gpumemhook.GpuMemHookError as e:
            print("refused:", e)
        """
    ).stdout
    assert "refused:" in out and "GPUMEMHOOK_EMULATE=t4" in out and "--emulate" in out


def test_emulate_of_the_card_the_process_started_with_does_nothing(runner):
    out = runner.run(
        """
        import gpumemhook
        malloc(1000)
        gpumemhook.emulate("T4")      # the same card, spelled otherwise
        try:
            gpumemhook.emulate("l4")
        except gpumemhook.GpuMemHookError as e:
            print("refused:", e)
        d = gpumemhook.snapshot()["devices"][0]
        print("card", d["emulated"]["card"], d["emulated"]["total"], d["emulated"]["overhead"])
        """,
        env={
            "GPUMEMHOOK_EMULATE": "t4",
            "FAKECUDA_CONTEXT_BYTES": str(300 << 20),
            "FAKECUDA_MEM_BYTES": str(40 << 30),
        },
    ).stdout
    assert "GPUMEMHOOK_EMULATE=t4" in out.split("refused:")[1]
    assert "card t4 {} {}".format(T4, 300 << 20) in out


def test_the_nvml_helpers_see_the_emulated_card(runner):
    # gpumemhook.mem reads NVML (dlopen'd by path, like pynvml): the same card as CUDA.
    out = runner.run(
        """
        from gpumemhook import mem
        malloc(1000)
        total, free, used = mem.gpu_mem_get(0)
        print("nvml", total, free, used)
        """,
        env={
            "GPUMEMHOOK_EMULATE": "t4",
            "FAKECUDA_CONTEXT_BYTES": str(300 << 20),
            "FAKECUDA_MEM_BYTES": str(40 << 30),
        },
    ).stdout
    line = [l for l in out.splitlines() if l.startswith("nvml")][0].split()
    total_mb, free_mb, used_mb = (int(float(x)) for x in line[1:])
    assert total_mb == 15360, out
    # 1000 bytes allocated plus the 300 MiB context: each figure rounded down to whole MB.
    assert used_mb == 300, out
    assert free_mb == 15360 - 300 - 1, out
