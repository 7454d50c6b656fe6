"""``patch_attribute``, the reversible patch every workaround applies: what it undoes is what was there; and
``run_after``, a method that runs a mend after the original on what it was given and returned."""

from __future__ import annotations

from hfexport.workarounds.registry import patch_attribute, run_after


class _Base:
    @staticmethod
    def chunk(x: int, w: int) -> int:
        return x + w

    def scale(self, x: int) -> int:
        return 2 * x


class _Child(_Base):
    pass


def test_a_staticmethod_patched_and_undone_is_a_staticmethod_again():
    """Longformer's ``_chunk`` is a staticmethod its instances call as ``self._chunk(x, w)``: undone through
    ``getattr``, the class held the bare function and bound it as a method (3 arguments for 2)."""
    undo = patch_attribute(_Base, "chunk", staticmethod(lambda x, w: x * w))
    assert _Base().chunk(3, 4) == 12
    undo()
    assert isinstance(vars(_Base)["chunk"], staticmethod) and _Base().chunk(3, 4) == 7


def test_an_inherited_attribute_patched_on_a_subclass_is_inherited_again_after_the_undo():
    undo_outer = patch_attribute(_Child, "scale", lambda self, x: 3 * x)
    undo_inner = patch_attribute(_Child, "scale", lambda self, x: 4 * x)
    assert _Child().scale(1) == 4
    undo_inner()
    assert _Child().scale(1) == 3
    undo_outer()
    assert "scale" not in vars(_Child) and _Child().scale(1) == 2
    undo_base = patch_attribute(_Base, "scale", lambda self, x: 5 * x)
    assert _Child().scale(1) == 5  # it follows its base again: no copy of the method left frozen on it
    undo_base()


def test_run_after_mends_after_the_original_returns_its_result_and_undoes():
    seen = []
    undo = run_after(_Base, "scale", lambda result, self, x: seen.append((result, x)))
    base = _Base()
    assert base.scale(5) == 10 and seen == [(10, 5)]  # the original ran first, its result handed on and returned
    assert _Base.scale.__name__ == "scale"
    undo()
    assert base.scale(6) == 12 and seen == [(10, 5)]
    assert _Child().scale(1) == 2 and "scale" not in vars(_Child)
