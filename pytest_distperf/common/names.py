"""How profilers name collectives and dtypes: canonical names, message sizes.  Stdlib only."""

from __future__ import annotations

ALIASES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_base": "all_gather",
    "allgather_into_tensor": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "recvanysource": "recv",
}
#: record_param_comms names that are bookkeeping, not a collective.
NOT_COLLECTIVES = frozenset({"wait", "init", "coalesced", "wait_tensor", "start_coalescing",
                              "end_coalescing", ""})
P2P = frozenset({"send", "recv"})
#: Collectives whose message is the same size on every rank (so the desync check compares it).
SAME_SIZE_EVERYWHERE = frozenset({"all_reduce", "all_reduce_coalesced", "broadcast", "reduce",
                                   "all_gather", "all_gather_coalesced", "reduce_scatter",
                                   "reduce_scatter_coalesced", "barrier"})
#: Collectives a backend runs as another, by what it runs: gloo has no reduce-scatter of its
#: own and runs ``reduce_scatter_tensor`` as an all-reduce of the whole input (its
#: ``gloo:all_reduce`` annotation), which belongs to the reduce-scatter call.
RUN_AS: dict[str, tuple[str, ...]] = {"all_reduce": ("reduce_scatter",)}
COMM_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")

DTYPES: dict[str, tuple[str, int]] = {}
for _names, _canonical, _size in (
    (("float", "float32"), "float32", 4),
    (("double", "float64"), "float64", 8),
    (("half", "float16"), "float16", 2),
    (("bfloat16",), "bfloat16", 2),
    (("long", "long int", "int64", "int64_t", "long long", "long long int"), "int64", 8),
    (("int", "int32", "int32_t"), "int32", 4),
    (("short", "short int", "int16"), "int16", 2),
    (("char", "signed char", "int8"), "int8", 1),
    (("byte", "unsigned char", "uint8"), "uint8", 1),
    (("bool",), "bool", 1),
    (("uint16", "unsigned short"), "uint16", 2),
    (("uint32", "unsigned int"), "uint32", 4),
    (("uint64", "unsigned long", "unsigned long int"), "uint64", 8),
    (("complexhalf", "complex<half>", "complex32"), "complex32", 4),
    (("complexfloat", "complex<float>", "complex64"), "complex64", 8),
    (("complexdouble", "complex<double>", "complex128"), "complex128", 16),
    (("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"), "float8", 1),
):
    for _name in _names:
        DTYPES[_name] = (_canonical, _size)


def canonical_collective(name: str) -> str:
    """``c10d::allreduce_``, ``allreduce``, ``gloo:all_reduce`` -> ``all_reduce``; other names
    come back lower-cased without namespace and underscores at the ends."""
    base = name.rsplit("::", 1)[-1].rsplit(":", 1)[-1].strip("_").lower()
    return ALIASES.get(base, base)


def canonical_dtype(name: object) -> tuple[str, int]:
    """(torch-style dtype name, bytes per element) from a profiler's spelling of a dtype:
    ``"Float"`` (record_param_comms), ``"float"``, ``"c10::BFloat16"`` (operator inputs).
    Unknown: ``("", 0)``."""
    text = str(name or "").strip().strip('"').lower().replace("c10::", "")
    return DTYPES.get(text, ("", 0))
