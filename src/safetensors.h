// safetensors.h — a model's parameters as a safetensors file, the format PyTorch users load
// (docs/safetensors.md), written and read in plain C with no library.
//
// Bytes: a u64 little-endian header length N; N bytes of JSON, written without whitespace
// and padded with spaces so that 8 + N is a multiple of 8; then the data, the flat float32
// parameter buffer byte for byte. The JSON's keys, in this order:
//   "__metadata__": {"format":"attnres.c","format_version":"1", then every ModelConfig
//                    field by its C name, in struct order, as a decimal string}
//   one entry a tensor, in the flat buffer's order (PARAMETER_TENSORS, absent kinds left out,
//   slices ascending within a kind): "NAME":{"dtype":"F32","shape":[..],"data_offsets":[B,E]}
// Names and shapes, PyTorch's [out, in] layout (i a layer, l a depth-attention slice 0 .. 2L
// (2L: the output aggregation), or for hc.* a sub-layer 0 .. 2L-1):
//   wte.weight [V,d]; layers.{i}.attn_norm.weight [d]; layers.{i}.attn.wq.weight [H*hs,d],
//   .wk and .wv [G*hs,d], .wo [d,H*hs]; layers.{i}.mlp_norm.weight [d];
//   layers.{i}.mlp.wg.weight and .wu [F,d], .wd [d,F]; hc.{l}.norm.weight [m*d];
//   hc.{l}.proj.weight [2m+R, m*d]; hc.{l}.bias [2m+R]; hc.{l}.scale [3];
//   res.{l}.logits and res.{l}.scalars [2L+1]; res.{l}.query [d]; res.{l}.norm.weight [d];
//   res.{l}.qproj.weight [d,d]; final_norm.weight [d]; lm_head.weight [V,d].
// The reader takes the metadata's keys in any order (ignoring unknown ones) and the tensors in
// any order, and refuses, in one line, everything else that is not such a file.
#ifndef ATTNRES_SAFETENSORS_H
#define ATTNRES_SAFETENSORS_H

#include <stddef.h>
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAFETENSORS_FORMAT "attnres.c"
#define SAFETENSORS_FORMAT_VERSION "1"
// The longest JSON header read (the safetensors library's own limit): a longer one is refused
// before anything is allocated for it.
#define SAFETENSORS_MAX_HEADER 100000000ull

// The name of slice `slice` of parameter tensor `kind` (ParamIndex) into name (64 bytes are
// enough), its shape into shape[] (at most 2 dimensions) and its rank returned: 1 or 2.
// *slices: how many such tensors the kind has in config c (0: absent).
int safetensors_tensor(const ModelConfig* c, int kind, size_t slice, char* name, size_t name_len,
                       size_t shape[2], size_t* slices);

// The whole file for config c and its flat parameters (param_sizes(c) floats, canonical
// order): malloc'd, *len bytes.
unsigned char* safetensors_encode(const ModelConfig* c, const float* params, size_t* len);
// Writes it to path: PATH.tmp.<pid>, synced, renamed over path (as checkpoints are).
// 0, or -1 with one line in err.
int safetensors_save(const ModelConfig* c, const float* params, const char* path, char* err,
                     size_t err_len);

// Checks bytes[0 .. len) for every way it could be no file of this format (the header's
// length, its JSON, the metadata, each tensor's name, dtype, shape and offsets, the data's
// values) and reads it: the config into *config, the parameters into *params (malloc'd,
// canonical order). 0, or -1 with one line in err (*params then NULL).
int safetensors_decode(const unsigned char* bytes, size_t len, ModelConfig* config,
                       float** params, char* err, size_t err_len);
// safetensors_decode of file path; err's line names the file.
int safetensors_load(const char* path, ModelConfig* config, float** params, char* err,
                     size_t err_len);

// ./train --export OUT --checkpoint PATH: the checkpoint's parameters written to OUT; its
// step and the number of tensors written into *step and *tensors. 0, or -1 with one line in
// err (nothing written). Which OUT may be replaced is outputs_check's (outputs.h),
// called first.
int safetensors_export_checkpoint(const char* checkpoint, const char* out, int* step,
                                  size_t* tensors, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
