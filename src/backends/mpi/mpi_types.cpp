// commgrid's element types and reductions on MPI: the datatypes, the reduction ops, and the
// user ops that reduce bfloat16 and float16 through float32.
#include <cstdint>
#include <mutex>

#include "mpi_internal.hpp"
#include "reduce_util.hpp"

namespace commgrid::mpi_backend {

std::string error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(buf, static_cast<std::size_t>(len));
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::bfloat16: return MPI_UINT16_T;  // 16-bit storage; reduced by our own ops
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
    case DataType::float16: return MPI_UINT16_T;  // likewise
    case DataType::int8: return MPI_INT8_T;
    case DataType::uint8: return MPI_UINT8_T;
  }
  COMMGRID_ENFORCE(false, "unknown DataType " + std::to_string(static_cast<int>(t)));
}

namespace {

// ---- bfloat16 and float16 reductions ------------------------------------------------
// MPI has no bfloat16 (nor, portably, float16), so 16-bit floats travel as 16-bit integers
// and are reduced by user ops that widen each pair to float32, reduce with the kernels every
// CPU backend shares (detail::combine: max and min keep NaN, so a NaN gradient is never
// hidden) and round back, as NCCL does at each step of a ring.

template <ReduceOp Op, bool Bf16>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if constexpr (Bf16)
      b[i] = float_to_bf16(detail::combine<Op>(bf16_to_float(a[i]), bf16_to_float(b[i])));
    else b[i] = float_to_fp16(detail::combine<Op>(fp16_to_float(a[i]), fp16_to_float(b[i])));
  }
}

std::mutex g_ops_mutex;
// [0]: bfloat16, [1]: float16; by ReduceOp sum, max, min, prod.
MPI_Op g_half_ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                           {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
bool g_half_ops_created = false;

// MPI deletes MPI_COMM_SELF's attributes at the start of MPI_Finalize: the standard hook
// for freeing library objects before MPI goes away, whoever owns MPI.
int free_half_ops(MPI_Comm, int, void*, void*) {
  std::lock_guard lock(g_ops_mutex);
  for (auto& row : g_half_ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  g_half_ops_created = false;
  return MPI_SUCCESS;
}

MPI_Op half_op(ReduceOp op, DataType t) {
  std::lock_guard lock(g_ops_mutex);
  if (!g_half_ops_created) {
    MPI_User_function* fns[2][4] = {
        {&half_reduce<ReduceOp::sum, true>, &half_reduce<ReduceOp::max, true>,
         &half_reduce<ReduceOp::min, true>, &half_reduce<ReduceOp::prod, true>},
        {&half_reduce<ReduceOp::sum, false>, &half_reduce<ReduceOp::max, false>,
         &half_reduce<ReduceOp::min, false>, &half_reduce<ReduceOp::prod, false>}};
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 4; ++i) {
        int rc = MPI_Op_create(fns[k][i], /*commute=*/1, &g_half_ops[k][i]);
        if (rc != MPI_SUCCESS)
          throw BackendError("mpi MPI_Op_create for 16-bit floats: " + error_text(rc));
      }
    int keyval = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_ops, &keyval, nullptr);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    if (rc != MPI_SUCCESS)
      throw BackendError("mpi attribute on MPI_COMM_SELF for 16-bit float ops: " + error_text(rc));
    g_half_ops_created = true;
  }
  static_assert(static_cast<int>(ReduceOp::sum) == 0 && static_cast<int>(ReduceOp::max) == 1 &&
                static_cast<int>(ReduceOp::min) == 2 && static_cast<int>(ReduceOp::prod) == 3);
  return g_half_ops[t == DataType::bfloat16 ? 0 : 1][static_cast<int>(detail::engine_op(op))];
}

}  // namespace

// The MPI op for `op`; avg runs as a sum that the caller divides (detail::divide_by).
MPI_Op mpi_op(ReduceOp op, DataType t) {
  if (detail::is_half(t)) return half_op(op, t);
  switch (detail::engine_op(op)) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::avg: break;
  }
  COMMGRID_ENFORCE(false, "unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

}  // namespace commgrid::mpi_backend
