"""Writing a network to an exported model file (MindIR, ONNX, AIR), with a fixed or a
symbolic (dynamic) batch dimension. Used by export.py, and by eval.py and predict.py with
``runtime: onnxruntime`` (a checkpoint exported to a temporary ONNX file,
``src.deploy.inference``).

Dynamic batch (``export.py --dynamic_batch true``), as measured with MindSpore 2.10:

- ONNX: ``mindspore.onnx.export(..., dynamic_axes={"image": {0: "batch"}})`` makes the input's
  batch dimension symbolic (``dim_param: "batch"``) but still declares the output with the
  batch of the traced input (``dim_value: 2`` for a dummy batch of 2; ONNX Runtime then warns
  "Expected shape from model of {2,10} does not match actual shape of {5,10}" at every other
  batch). The graph itself holds no fixed batch, so ``declare_dynamic_batch`` rewrites the
  declared output dimension with the onnx library: input (batch, 3, H, W) -> output
  (batch, class_num).
- MINDIR: traced on ``Tensor(shape=[None, 3, H, W], dtype=mindspore.float32)``; the file
  declares (-1, 3, H, W) -> (-1, class_num) and runs in ``nn.GraphCell`` on CPU at any batch.
  The network first gets the zero-padding stem max pool (``use_exportable_max_pool``), as
  for ONNX: with the CPU/GPU form, ``nn.MaxPool2d(pad_mode="pad")`` (ExpandDims,
  MaxPool3DWithArgmax, Squeeze), MindSpore 2.10 loses the rank of the feature map under a
  dynamic batch (the file declares an output of rank -2, "any rank"), so ``nn.Dense``'s rank
  test becomes a run-time branch (Switch): ``nn.GraphCell`` then runs the first batch size it
  is given and fails at any other with "RuntimeError: The actor already exists:
  Default/Switch-op...". With the exportable pool the graph holds no branch.
- AIR: not supported (``DYNAMIC_BATCH_FORMATS``).
"""
import mindspore as ms

from src.models.stem_pool import use_exportable_max_pool

SUFFIXES = {"MINDIR": ".mindir", "ONNX": ".onnx", "AIR": ".air"}
"""File suffix per ``file_format``."""

# Formats whose graph gets the zero-padding stem max pool (``MaxPoolPad1``). ONNX: the exporter
# rejects MaxPool3DWithArgmax. AIR: the graph runs on Ascend, where MaxPool3DWithArgmax is only
# an AI CPU operator (a custom one of MindSpore's, CustMaxPool3DWithArgmax); Pad and MaxPool
# have AI Core kernels. MINDIR keeps the network as built, except with a dynamic batch (see the
# module docstring).
EXPORTABLE_POOL_FORMATS = ("ONNX", "AIR")

DYNAMIC_BATCH_FORMATS = ("ONNX", "MINDIR")
"""Formats that ``dynamic_batch`` exports with a symbolic batch dimension."""

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
BATCH_AXIS = "batch"
"""The ONNX graph's input and output names and the name of its symbolic batch dimension."""


def export_model(net, dummy, file_name, file_format, dynamic_batch=False):
    """Write ``net`` traced on ``dummy`` to ``file_name`` + the format's suffix.

    ONNX goes through ``mindspore.onnx.export`` (the successor of
    ``export(file_format='ONNX')``) with the graph's input named ``image`` and its output
    ``logits``. For ONNX and AIR (``EXPORTABLE_POOL_FORMATS``), and for a dynamic-batch MINDIR,
    ``net`` first gets the exportable form of its stem max pool (in place, same output:
    ``src.models.stem_pool.use_exportable_max_pool``: zero padding + valid pool for
    ``stem_pool_pad_mode pad``; MindCV's ``same`` pool is kept).

    Args:
        net (nn.Cell): The network in inference mode (BatchNorms folded or not).
        dummy (Tensor): float32 (batch_size, 3, H, W): the traced input; with
            ``dynamic_batch`` only its (3, H, W) and dtype are kept.
        file_name (str): The output file without suffix.
        file_format (str): ``MINDIR``, ``ONNX`` or ``AIR``.
        dynamic_batch (bool): Declare the batch dimension symbolic, in the input and the
            output (ONNX: ``batch``, MINDIR: -1): the file runs at any batch size.

    Raises:
        ValueError: If ``dynamic_batch`` is asked for AIR.
        OSError, RuntimeError: As MindSpore's exporters (a failed ONNX write is only logged:
            ``export.py`` checks the file).
    """
    if dynamic_batch and file_format not in DYNAMIC_BATCH_FORMATS:
        raise ValueError(f"dynamic_batch is supported for {' and '.join(DYNAMIC_BATCH_FORMATS)} "
                         f"only, not {file_format}")
    if file_format in EXPORTABLE_POOL_FORMATS or dynamic_batch:
        use_exportable_max_pool(net)
    if file_format == "ONNX":
        ms.onnx.export(net, dummy, file_name=file_name, input_names=[INPUT_NAME],
                       output_names=[OUTPUT_NAME],
                       dynamic_axes={INPUT_NAME: {0: BATCH_AXIS}} if dynamic_batch else None)
        if dynamic_batch:
            declare_dynamic_batch(file_name + SUFFIXES["ONNX"])
    else:
        if dynamic_batch:
            dummy = ms.Tensor(shape=[None, *dummy.shape[1:]], dtype=dummy.dtype)
        ms.export(net, dummy, file_name=file_name, file_format=file_format)


def declare_dynamic_batch(path):
    """Declare the first dimension of every output of an ONNX file symbolic (``batch``), in
    place, when its input's is: MindSpore 2.10's ONNX exporter declares the output with the
    traced batch size even with ``dynamic_axes`` (see the module docstring). A file that
    already declares it so, whose input has a fixed batch, or that is missing or does not
    parse (a failed write: the caller's load check names it), is left as it was.

    Args:
        path (str): An ``.onnx`` file written by ``export_model`` with ``dynamic_batch``.

    Returns:
        int: The number of output dimensions rewritten.

    Raises:
        OSError: If the rewritten file cannot be written.
    """
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


def declared_batch_dims(path):
    """The batch dimension an exported ONNX or MindIR file declares for its first input and
    its first output, read from the file (no runtime session).

    Args:
        path (str): An ``.onnx`` or ``.mindir`` file.

    Returns:
        tuple: (input batch, output batch), each an int, or None when symbolic (ONNX
        ``dim_param``, MindIR -1) or not declared (MindIR -2: any rank).

    Raises:
        ValueError: If the suffix is neither ``.onnx`` nor ``.mindir``.
        OSError, google.protobuf.message.DecodeError: If the file cannot be read or parsed.
    """
    if path.endswith(SUFFIXES["ONNX"]):
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
        dims = [value.type.tensor_type.shape.dim for value in (graph.input[0], graph.output[0])]
        return tuple(d[0].dim_value if d and d[0].HasField("dim_value") else None for d in dims)
    if path.endswith(SUFFIXES["MINDIR"]):
        from mindspore.train.mind_ir_pb2 import ModelProto

        model = ModelProto()
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
        dims = [value.tensor[0].dims for value in (model.graph.input[0], model.graph.output[0])]
        return tuple(d[0] if d and d[0] > 0 else None for d in dims)
    raise ValueError(f"{path}: expected an .onnx or .mindir file")
