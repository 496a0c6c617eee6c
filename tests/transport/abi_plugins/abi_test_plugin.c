/* A transport plugin that does nothing, built once per ABI case the loader must handle
 * (abi_loader_test.cc): ABI_CASE selects what the exported struct gets right or wrong. Plain C,
 * like a plugin written by someone else against transport.h alone. */
#include "plugins/transport/transport.h"

#define ABI_GOOD 0          /* a correct plugin */
#define ABI_NEWER 1         /* built against a later header: struct_size beyond the loader's */
#define ABI_SMALL 2         /* a struct_size short of the required members */
#define ABI_VERSION 3       /* another (incompatible) ABI version */
#define ABI_NO_SYMBOL 4     /* exports the symbol of the layout before struct_size */
#define ABI_NULL_MEMBER 5   /* a required member left NULL */

/* Not every case uses every function. */
#define FN static __attribute__((unused))

FN ring_transport_status_t probe(char* reason, size_t len) {
  if (reason && len) reason[0] = '\0';
  return RING_TRANSPORT_OK;
}
FN ring_transport_status_t init(const ring_transport_config_t* c, ring_transport_comm_t** o) {
  (void)c;
  *o = 0;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t finalize(ring_transport_comm_t* c) {
  (void)c;
  return RING_TRANSPORT_OK;
}
FN ring_transport_status_t connect(ring_transport_comm_t* c, const int* p, int n, int t) {
  (void)c, (void)p, (void)n, (void)t;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t isend(ring_transport_comm_t* c, const void* b, size_t s, int p,
                                     uint32_t t, ring_transport_request_t** r) {
  (void)c, (void)b, (void)s, (void)p, (void)t, (void)r;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t irecv(ring_transport_comm_t* c, void* b, size_t s, int p,
                                     uint32_t t, ring_transport_request_t** r) {
  (void)c, (void)b, (void)s, (void)p, (void)t, (void)r;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t test(ring_transport_comm_t* c, ring_transport_request_t* r, int* d,
                                    size_t* b) {
  (void)c, (void)r, (void)d, (void)b;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t wait(ring_transport_comm_t* c, ring_transport_request_t* r, int t,
                                    size_t* b) {
  (void)c, (void)r, (void)t, (void)b;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t sum(ring_transport_comm_t* c, const float* s, float* r, size_t n,
                                   int t) {
  (void)c, (void)s, (void)r, (void)n, (void)t;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t gather(ring_transport_comm_t* c, const void* s, void* r, size_t n,
                                      int t) {
  (void)c, (void)s, (void)r, (void)n, (void)t;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN ring_transport_status_t barrier(ring_transport_comm_t* c, int t) {
  (void)c, (void)t;
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}
FN const char* last_error(const ring_transport_comm_t* c) {
  (void)c;
  return "";
}

#define MEMBERS                                                                            \
  .name = "abi_test", .caps = RING_TRANSPORT_CAP_HOST_MEMORY, .probe = probe, .init = init, \
  .finalize = finalize, .connect = connect, .isend = isend, .irecv = irecv, .test = test,   \
  .wait = wait, .all_reduce_sum_f32 = sum, .reduce_scatter_sum_f32 = sum,                    \
  .all_gather = gather, .barrier = barrier

#define EXPORT __attribute__((visibility("default")))

#if ABI_CASE == ABI_GOOD
EXPORT const ring_transport_t ring_transport_plugin = {RING_TRANSPORT_HEADER, MEMBERS,
                                                       .last_error = last_error};
#elif ABI_CASE == ABI_NEWER
/* What a later header could look like: one member appended. */
struct later {
  ring_transport_t v1;
  void (*appended)(void);
};
static void appended(void) {}
EXPORT const struct later ring_transport_plugin = {
    {.abi_version = RING_TRANSPORT_ABI_VERSION, .struct_size = sizeof(struct later), MEMBERS,
     .last_error = last_error},
    appended};
#elif ABI_CASE == ABI_SMALL
/* Only the members up to caps: a reader of sizeof(ring_transport_t) bytes would read past it. */
struct early {
  uint32_t abi_version, struct_size;
  const char* name;
  uint64_t caps;
};
EXPORT const struct early ring_transport_plugin = {RING_TRANSPORT_ABI_VERSION,
                                                   sizeof(struct early), "abi_test", 0};
#elif ABI_CASE == ABI_VERSION
EXPORT const ring_transport_t ring_transport_plugin = {
    .abi_version = RING_TRANSPORT_ABI_VERSION + 98, .struct_size = sizeof(ring_transport_t),
    MEMBERS, .last_error = last_error};
#elif ABI_CASE == ABI_NO_SYMBOL
EXPORT const ring_transport_t ring_transport_v1 = {RING_TRANSPORT_HEADER, MEMBERS,
                                                   .last_error = last_error};
#elif ABI_CASE == ABI_NULL_MEMBER
EXPORT const ring_transport_t ring_transport_plugin = {RING_TRANSPORT_HEADER, MEMBERS,
                                                       .last_error = 0};
#endif
