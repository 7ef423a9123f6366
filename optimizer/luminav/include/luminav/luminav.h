/* include/luminav/luminav.h: the C API of the LuminaMoon native engine
 *
 * A TDCLM optimizer (docs/tdclm.md) over tensors the caller owns, described by raw pointers,
 * dtypes and element counts, stepped on CPU threads, or through an AOT bundle on a CUDA device or
 * an AMD one (HIP).
 *
 * HIP (LV_DEVICE_HIP): the same engine and launch path as CUDA over the HIP runtime
 * (libamdhip64.so, loaded at run time). The caller names the device's arch
 * (lv_optimizer_options.arch, e.g. torch.cuda.get_device_properties(i).gcnArchName on a ROCm
 * torch); streams are hipStream_t. What HIP lacks here: graph replay (every step launches its
 * kernels; CUDA replays from the second step of a layout as a CUDA graph) and the capture query
 * (every HIP step zeroes its own step flags with one more memset, so a step the caller captures
 * into a hipGraph stays correct). No AMD GPU has run these kernels yet: what is tested is what
 * loads and what would be launched.
 *
 * Conventions
 * - Every function returns an lv_status; LV_STATUS_OK (0) is success. On failure,
 *   lv_last_error() returns a message naming the bad value and the fix; it is thread-local and
 *   stays valid until the next failing call on the same thread.
 * - Handles are opaque. A handle is a token, not an address: a destroyed (or never created)
 *   handle is detected and answered with LV_STATUS_STATE_ERROR, and tokens are never reused.
 * - OWNERSHIP is stated on every pointer argument: "borrowed" means the library reads (or
 *   writes) it during the call only, or for as long as stated, and never frees it; "out" means
 *   the library writes the result there.
 * - Calls on one optimizer are serialised by the library (a per-optimizer lock).
 * What remains undefined: pointers to tensor storage that do not point to the stated number of
 * elements of the stated dtype on the stated device, or whose storage is freed while the
 * optimizer still uses it; CUDA (HIP) streams that do not belong to the optimizer's device.
 */
#ifndef LUMINAV_LUMINAV_H_
#define LUMINAV_LUMINAV_H_

#include <stddef.h>
#include <stdint.h>

#if defined(LUMINAV_BUILDING_SHARED) || defined(LUMINAV_STATIC_CORE)
#define LV_API __attribute__((visibility("default")))
#else
#define LV_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The API version this header describes; lv_api_version() returns the library's. */
#define LV_API_VERSION 1

/* Status codes: the values of luminav::Status (luminav/error.h). */
typedef enum lv_status {
  LV_STATUS_OK = 0,
  LV_STATUS_INVALID_ARGUMENT = 1, /* a value is out of range, null, or inconsistent */
  LV_STATUS_BUNDLE_ERROR = 2,     /* the AOT bundle is missing, corrupt or incompatible */
  LV_STATUS_DRIVER_ERROR = 3,     /* no CUDA driver (HIP runtime), or a driver call failed */
  LV_STATUS_NOT_FOUND = 4,        /* a kernel variant, device or file does not exist */
  LV_STATUS_STATE_ERROR = 5,      /* e.g. a destroyed handle */
  LV_STATUS_NON_FINITE = 6,       /* nonfinite=raise met a non-finite gradient; nothing changed */
  LV_STATUS_INTERNAL = 7          /* a broken invariant inside the library */
} lv_status;

/* LV_DTYPE_Q8: a state dtype only (lv_hyperparams.state_dtype): each moment as one uint8 code an
 * element and a float32 scale a block of 256 (docs/tdclm.md "Quantized moments (q8)"). */
typedef enum lv_dtype { LV_DTYPE_FLOAT32 = 0, LV_DTYPE_BFLOAT16 = 1, LV_DTYPE_FLOAT16 = 2, LV_DTYPE_Q8 = 3 } lv_dtype;
typedef enum lv_device_type { LV_DEVICE_CPU = 0, LV_DEVICE_CUDA = 1, LV_DEVICE_HIP = 2 } lv_device_type;
typedef enum lv_bound_mode { LV_BOUND_NONE = 0, LV_BOUND_ABS = 1, LV_BOUND_REL = 2 } lv_bound_mode;
typedef enum lv_nonfinite { LV_NONFINITE_SKIP = 0, LV_NONFINITE_RAISE = 1, LV_NONFINITE_PROPAGATE = 2 } lv_nonfinite;

typedef struct lv_optimizer lv_optimizer; /* opaque */

/* Options of lv_optimizer_create. Fill with lv_optimizer_options_init first. */
typedef struct lv_optimizer_options {
  uint32_t struct_size;   /* sizeof(lv_optimizer_options), set by lv_optimizer_options_init */
  int32_t device;         /* lv_device_type */
  int32_t device_index;   /* CUDA (HIP) device ordinal */
  int32_t num_threads;    /* CPU worker threads; 0 = one per hardware thread */
  uint64_t seed;          /* base seed of the stochastic-rounding streams */
  const char* bundle_dir; /* borrowed during lv_optimizer_create; CUDA and HIP: the AOT bundle folder */
  /* Added after bundle_dir (a caller whose struct_size ends at bundle_dir is still accepted; it
   * cannot ask for HIP). */
  const char* arch;       /* borrowed during lv_optimizer_create; HIP only: the device's arch,
                             "gfx942" or its gcnArchName "gfx942:sramecc+:xnack-" */
} lv_optimizer_options;

/* Hyperparameters of one param group (docs/tdclm.md). Fill with lv_hyperparams_init first. */
typedef struct lv_hyperparams {
  uint32_t struct_size;
  double lr;
  double beta1, beta2;
  double eps;
  double weight_decay;
  double clip;
  int32_t bound_mode; /* lv_bound_mode */
  double bound;
  int32_t maximize;   /* 0 or 1 */
  int32_t nonfinite;  /* lv_nonfinite */
  int32_t stochastic_rounding; /* 0 or 1 */
  int32_t state_dtype;         /* LV_DTYPE_FLOAT32, LV_DTYPE_BFLOAT16 or LV_DTYPE_Q8 (every parameter of
                                  the group then keeps q8 moments, whatever its size) */
} lv_hyperparams;

/* One parameter. Fill with lv_param_desc_init first. */
typedef struct lv_param_desc {
  uint32_t struct_size;
  void* data;         /* borrowed for the optimizer's lifetime: numel elements of dtype, on its device */
  int32_t dtype;      /* lv_dtype */
  const void* grad;   /* borrowed until replaced (lv_optimizer_set_grad); null = no gradient (not stepped) */
  int32_t grad_dtype; /* lv_dtype */
  int64_t numel;
  void* exp_avg;      /* optional, borrowed for the optimizer's lifetime: numel of state_dtype, zeroed
                         by the caller; null = the optimizer allocates and owns it */
  void* exp_avg_sq;   /* optional, as exp_avg */
  void* p_init;       /* optional, as exp_avg but of dtype; used only when bound_mode != none; the
                         optimizer fills it with p before the first update */
  /* Added after p_init (a caller whose struct_size ends at p_init is still accepted; it cannot
   * lend q8 scales or give a row_len). q8 moments (the group's state_dtype LV_DTYPE_Q8) only; all
   * zero/null otherwise. exp_avg and exp_avg_sq then hold numel uint8 codes (lent: set to the
   * zero codes, 128 for exp_avg and 0 for exp_avg_sq). */
  void* exp_avg_scale;    /* optional, borrowed as exp_avg and lent with it (both or neither): the
                             float32 block scales of exp_avg, scale_numel of them, zeroed */
  void* exp_avg_sq_scale; /* optional, as exp_avg_scale, lent with exp_avg_sq */
  int64_t scale_numel;    /* float32 values each lent scale buffer holds: must be
                             numel / row_len * ceil(row_len / 256); 0 when none is lent */
  int64_t row_len;        /* elements of a block row (numel / shape[0] of a matrix); 0 = numel */
} lv_param_desc;

/* The library's API version; the C++ API refuses a library whose version differs from
 * LV_API_VERSION. */
LV_API uint32_t lv_api_version(void);
/* The library's version string, "major.minor.patch" (static storage; do not free). */
LV_API const char* lv_version_string(void);
/* The message of the last failing call on this thread ("" when none). Owned by the library;
 * valid until the next failing call on this thread. */
LV_API const char* lv_last_error(void);
/* A constant name for a status, e.g. "LV_STATUS_INVALID_ARGUMENT" (static storage). */
LV_API const char* lv_status_string(lv_status status);
/* 1 when a CUDA driver can be loaded, else 0. Never fails. */
LV_API int lv_cuda_driver_available(void);
/* 1 when a HIP runtime (libamdhip64.so) can be loaded, else 0. Never fails. */
LV_API int lv_hip_runtime_available(void);

/* Defaults. `options`/`hyper`/`desc`: out, must not be null. */
LV_API lv_status lv_optimizer_options_init(lv_optimizer_options* options);
LV_API lv_status lv_hyperparams_init(lv_hyperparams* hyper);
LV_API lv_status lv_param_desc_init(lv_param_desc* desc);

/* options: borrowed during the call. out: out, receives a new handle the caller owns and
 * releases with lv_optimizer_destroy. CUDA without a driver (HIP without a HIP runtime) gives
 * LV_STATUS_DRIVER_ERROR, a bad bundle LV_STATUS_BUNDLE_ERROR / LV_STATUS_NOT_FOUND, HIP without
 * an arch LV_STATUS_INVALID_ARGUMENT; *out is then untouched. */
LV_API lv_status lv_optimizer_create(const lv_optimizer_options* options, lv_optimizer** out);
/* Releases the optimizer and the state it allocated (never borrowed storage). Destroying a
 * destroyed handle gives LV_STATUS_STATE_ERROR; null gives LV_STATUS_INVALID_ARGUMENT. */
LV_API lv_status lv_optimizer_destroy(lv_optimizer* opt);

/* hyper: borrowed during the call (copied). out_group: out, may be null. */
LV_API lv_status lv_optimizer_add_group(lv_optimizer* opt, const lv_hyperparams* hyper, size_t* out_group);
/* desc: borrowed during the call; the pointers inside it as documented on lv_param_desc.
 * out_index: out (k, the parameter's index), may be null. */
LV_API lv_status lv_optimizer_add_param(lv_optimizer* opt, size_t group, const lv_param_desc* desc, size_t* out_index);
/* grad: borrowed until replaced; null = the parameter has no gradient (not stepped). */
LV_API lv_status lv_optimizer_set_grad(lv_optimizer* opt, size_t index, const void* grad);
LV_API lv_status lv_optimizer_set_lr(lv_optimizer* opt, size_t group, double lr);
/* out_lr: out. */
LV_API lv_status lv_optimizer_get_lr(const lv_optimizer* opt, size_t group, double* out_lr);

/* One step over every group. stream: borrowed during the call; the CUstream to launch on (CUDA;
 * null = the legacy default stream) or the hipStream_t (HIP; null = the null stream), ignored
 * on CPU. On CUDA and HIP the step is asynchronous on the stream and, after the first step,
 * allocates nothing and does not synchronise (graph capturable), except with nonfinite=raise,
 * which reads the flag on the host. A kernel a step cannot load or launch gives
 * LV_STATUS_DRIVER_ERROR (or the bundle's status) naming the kernel; a step that fails before
 * its first launch changes nothing. */
LV_API lv_status lv_optimizer_step(lv_optimizer* opt, void* stream);

/* out_*: out. May synchronise the device. */
LV_API lv_status lv_optimizer_get_param_step(const lv_optimizer* opt, size_t index, int64_t* out_step);
LV_API lv_status lv_optimizer_get_skipped_steps(const lv_optimizer* opt, int64_t* out_skipped);
LV_API lv_status lv_optimizer_get_seed(const lv_optimizer* opt, uint64_t* out_seed);
LV_API lv_status lv_optimizer_get_num_params(const lv_optimizer* opt, size_t* out_count);

/* Serialises the state (moments, p_init, per-parameter steps, seed, skipped count).
 * buffer: borrowed, written, may be null when capacity is 0; out_size: out, the bytes needed.
 * With capacity < *out_size nothing is written and LV_STATUS_INVALID_ARGUMENT is returned
 * (call once with capacity 0 to size the buffer). */
LV_API lv_status lv_optimizer_export_state(const lv_optimizer* opt, void* buffer, size_t capacity, size_t* out_size);
/* Restores a state exported from an optimizer with the same groups, parameters and dtypes.
 * buffer: borrowed during the call. A state that does not fit changes nothing. */
LV_API lv_status lv_optimizer_import_state(lv_optimizer* opt, const void* buffer, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LUMINAV_LUMINAV_H_ */
