"""Writers of exported model files, one per format of ``src.deploy.formats.FORMATS``, and
the batch dimension a written file declares. Graph forms and dynamic batch:
docs/deployment.md#export, docs/deployment.md#dynamic-batch.
"""
import mindspore as ms
from mindspore import nn

from src.models.stem_pool import use_exportable_max_pool
from src.models.tta import inner_network

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
BATCH_AXIS = "batch"
"""The ONNX graph's input and output names and the name of its symbolic batch dimension."""


def write_onnx(net: nn.Cell, dummy: ms.Tensor, path: str, dynamic_batch: bool) -> None:
    """``net`` traced on ``dummy`` as ONNX at ``path`` (input ``image``, output ``logits``,
    the exportable stem max pool); a failed write is only logged by MindSpore."""
    use_exportable_max_pool(inner_network(net))
    ms.onnx.export(net, dummy, file_name=path, input_names=[INPUT_NAME],
                   output_names=[OUTPUT_NAME],
                   dynamic_axes={INPUT_NAME: {0: BATCH_AXIS}} if dynamic_batch else None)
    if dynamic_batch:
        declare_dynamic_batch(path)


def write_mindir(net: nn.Cell, dummy: ms.Tensor, path: str, dynamic_batch: bool) -> None:
    """``net`` traced on ``dummy`` as MindIR at ``path``, as built; with ``dynamic_batch``
    traced on (None, 3, H, W) with the exportable stem max pool."""
    if dynamic_batch:
        use_exportable_max_pool(inner_network(net))
        dummy = ms.Tensor(shape=[None, *dummy.shape[1:]], dtype=dummy.dtype)
    ms.export(net, dummy, file_name=path, file_format="MINDIR")


def write_air(net: nn.Cell, dummy: ms.Tensor, path: str, dynamic_batch: bool) -> None:
    """``net`` traced on ``dummy`` as AIR (Ascend) at ``path``, the exportable stem max
    pool."""
    del dynamic_batch  # not supported: refused by ``src.deploy.formats.export_model``
    use_exportable_max_pool(inner_network(net))
    ms.export(net, dummy, file_name=path, file_format="AIR")


def declare_dynamic_batch(path: str) -> int:
    """Declare every output's batch of an ONNX file symbolic, in place, when its input's is
    (MindSpore 2.10 declares the traced one); a missing or unparsable file is left to the
    load check. Returns the number of dimensions rewritten; OSError if it cannot write."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(path)
    except (OSError, DecodeError):  # MindSpore logs a failed write, removes the file, returns
        return 0
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    if not batch.dim_param:
        return 0
    changed = 0
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims and dims[0].dim_param != batch.dim_param:
            dims[0].Clear()
            dims[0].dim_param = batch.dim_param
            changed += 1
    if changed:
        onnx.save(model, path)
    return changed


def onnx_batch_dims(path: str) -> tuple[int | None, int | None]:
    """The (input, output) batch an ONNX file declares: an int, or None when symbolic."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    dims = [value.type.tensor_type.shape.dim for value in (graph.input[0], graph.output[0])]
    return tuple(d[0].dim_value if d and d[0].HasField("dim_value") else None for d in dims)


def mindir_batch_dims(path: str) -> tuple[int | None, int | None]:
    """The (input, output) batch a MindIR file declares: an int, or None when symbolic (-1)
    or not declared (-2: any rank)."""
    model = read_mindir(path)
    dims = [value.tensor[0].dims for value in (model.graph.input[0], model.graph.output[0])]
    return tuple(d[0] if d and d[0] > 0 else None for d in dims)


def read_mindir(path: str):
    """A MindIR file's ``ModelProto`` (``mindspore.train.mind_ir_pb2``); protobuf's
    DecodeError if it is not one, OSError if unreadable."""
    from mindspore.train.mind_ir_pb2 import ModelProto

    model = ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return model


def record_onnx(path: str, metadata: dict[str, str]) -> None:
    """Add ``metadata`` to an ONNX file's ``metadata_props``, in place."""
    import onnx

    model = onnx.load(path)
    onnx.helper.set_model_props(model, {**onnx_metadata(model), **metadata})
    onnx.save(model, path)


def onnx_metadata(source) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file (a path) or ``ModelProto``."""
    import onnx

    model = onnx.load(source, load_external_data=False) if isinstance(source, str) else source
    return {prop.key: prop.value for prop in model.metadata_props}


def record_mindir(path: str, metadata: dict[str, str]) -> None:
    """Add ``metadata`` to a MindIR file's ``user_info`` (MindSpore's key-value map of the
    model), in place."""
    model = read_mindir(path)
    model.user_info.update(metadata)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def mindir_metadata(path: str) -> dict[str, str]:
    """The ``user_info`` of a MindIR file."""
    return dict(read_mindir(path).user_info)
