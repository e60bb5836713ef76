"""doctor's tests (sglpatch.doctor and `sglpatch doctor`)."""
