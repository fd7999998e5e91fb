"""``core.aot.bytes_read_outside_custom_calls`` on handwritten compiled-HLO text, whose bytes are
counted by hand from the shapes."""

import pytest

from core import aot

HLO = """HloModule step

%fused_dus (param_0: f32[1024,128], param_1: f32[1,128], param_2: s32[]) -> f32[1024,128] {
  %param_0 = f32[1024,128]{1,0} parameter(0)
  %param_1 = f32[1,128]{1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  ROOT %dus = f32[1024,128]{1,0} dynamic-update-slice(%param_0, %param_1, %param_2, %c)
}

%fused_window (param_0.1: f32[1024,128], param_1.1: s32[]) -> f32[2,128] {
  %param_0.1 = f32[1024,128]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %c.1 = s32[] constant(0)
  ROOT %ds = f32[2,128]{1,0} dynamic-slice(%param_0.1, %param_1.1, %c.1), dynamic_slice_sizes={2,128}
}

%fused_scale (param_0.2: f32[1024,128]) -> f32[1024,128] {
  %param_0.2 = f32[1024,128]{1,0} parameter(0)
  ROOT %neg = f32[1024,128]{1,0} negate(%param_0.2)
}

ENTRY %main (cache: f32[1024,128], new: f32[1,128], at: s32[], q: bf16[4,128]) -> (f32[1024,128], f32[4,128]) {
  %cache = f32[1024,128]{1,0} parameter(0)
  %new = f32[1,128]{1,0} parameter(1)
  %at = s32[] parameter(2)
  %q = bf16[4,128]{1,0} parameter(3)
  %written = f32[1024,128]{1,0} fusion(%cache, %new, %at), kind=kLoop, calls=%fused_dus
  %window = f32[2,128]{1,0} fusion(%written, %at), kind=kLoop, calls=%fused_window
  %kernel = f32[4,128]{1,0} custom-call(%q, %written), custom_call_target="__gpu$xla.gpu.triton"
  %scaled = f32[1024,128]{1,0} fusion(%written), kind=kLoop, calls=%fused_scale
  ROOT %out = (f32[1024,128]{1,0}, f32[4,128]{1,0}) tuple(%scaled, %kernel)
}
"""


def test_counts_slices_updates_and_whole_operands():
    outside, custom = aot.bytes_read_outside_custom_calls(HLO)
    cache = 1024 * 128 * 4
    # the in-place write reads its update (512 B) and index (4 B), not the cache; the window
    # reads two rows (1 KiB) and its index; the negation reads the whole cache
    assert outside == (128 * 4 + 4) + (2 * 128 * 4 + 4) + cache
    assert custom == 4 * 128 * 2 + cache  # the kernel's operands, whole


def test_text_without_an_entry_is_refused():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        aot.bytes_read_outside_custom_calls("HloModule empty\n")
