"""``torch.searchsorted`` on the backends that have no translation for it (workarounds onnx-searchsorted,
openvino-searchsorted, executorch-searchsorted): Music Flamingo's audio timestamps in small."""

from __future__ import annotations

import pytest
import torch

from hfexport.workarounds.searchsorted import searchsorted_by_counting


class _Clips(torch.nn.Module):
    """Which clip each encoder row belongs to, and where each clip starts (Music Flamingo's
    ``_build_audio_timestamps``): a search to the right over running sums, then a left one over its result."""

    def forward(self, rows_per_clip: torch.Tensor, clips_per_sample: torch.Tensor) -> tuple[torch.Tensor, ...]:
        starts = torch.cat([torch.zeros(1, dtype=rows_per_clip.dtype), rows_per_clip.cumsum(0)[:-1]])
        sample = torch.searchsorted(clips_per_sample.cumsum(0), starts, right=True)
        first = torch.searchsorted(sample, torch.arange(clips_per_sample.shape[0]))
        return sample, first, torch.searchsorted(rows_per_clip.sort().values[None].expand(2, -1),
                                                 rows_per_clip[None, :2].expand(2, -1) + 1, side="right")


def _inputs(clips: list[int]) -> dict:
    rows = torch.tensor([3 + (i % 3) for i in range(sum(clips))])
    return {"rows_per_clip": rows, "clips_per_sample": torch.tensor(clips)}


def test_counting_gives_searchsorted_for_either_side_flat_and_batched():
    torch.manual_seed(0)
    flat, values = torch.tensor([1.0, 3.0, 3.0, 7.0]), torch.tensor([[0.0, 3.0, 8.0], [3.0, 2.0, 7.0]])
    rows = torch.sort(torch.randint(0, 9, (2, 3, 5)), -1).values
    probes = torch.randint(0, 10, (2, 3, 4))
    for right in (False, True):
        for entries, probe in ((flat, values), (rows, probes)):
            want = torch.searchsorted(entries, probe, right=right)
            assert torch.equal(searchsorted_by_counting(entries, probe, right=right), want)
    assert searchsorted_by_counting(flat, values, out_int32=True).dtype == torch.int32


_BACKENDS = {
    "onnx": ("onnxscript", "OnnxExporter", "OnnxConfig", "No ONNX function found for.*searchsorted"),
    "openvino": ("openvino", "OpenVINOExporter", "OpenVINOConfig", "searchsorted"),
    "executorch": ("executorch", "ExecutorchExporter", "ExecutorchConfig", "searchsorted.Tensor is not in Core ATen"),
}


@pytest.mark.parametrize("backend", list(_BACKENDS))
def test_a_searchsorted_program_lowers_and_matches_eager(backend, monkeypatch):
    import hfexport
    from hfexport.workarounds import searchsorted

    package, exporter_name, config_name, upstream = _BACKENDS[backend]
    pytest.importorskip(package, reason=f"the {backend} backend's own package (pip install hfexport[{backend}])")
    exporter, config = getattr(hfexport, exporter_name), getattr(hfexport, config_name)
    model = _Clips()
    exported = exporter().export(model, _inputs([2, 3]), config(dynamic=backend != "executorch"))
    assert f"{backend}-searchsorted" in exported.components["model"].metadata.workarounds
    for clips in ([2, 3], [1, 1, 2]) if backend != "executorch" else ([2, 3],):
        inputs = _inputs(clips)
        got, want = exported(**inputs), model(**inputs)
        assert all(torch.equal(g.long(), w) for g, w in zip(got, want, strict=True)), (clips, got, want)

    monkeypatch.setattr(searchsorted, "_searchsorted", lambda original: original)
    with pytest.raises(Exception, match=upstream):
        exporter().export(model, _inputs([2, 3]), config(dynamic=backend != "executorch"))
