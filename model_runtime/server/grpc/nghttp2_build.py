"""Makes :mod:`._nghttp2_ffi`, the out-of-line ABI-mode cffi module :mod:`.nghttp2` opens
libnghttp2 with: the declarations below (the part of ``nghttp2/nghttp2.h`` 1.52 the gRPC
transport calls), parsed once here instead of at each daemon start (cffi's ``cdef`` parses
with pycparser). The generated module is committed, like the ``*_pb2.py`` files; after a change
to :data:`CDEF` regenerate it (``python -m model_runtime.server.grpc.nghttp2_build``) and commit
it (``tests/unit/test_nghttp2_build.py`` fails while the two differ). No compiler is involved:
ABI mode writes Python source.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the generated module's name, and its file beside this one
MODULE = "model_runtime.server.grpc._nghttp2_ffi"
TARGET = Path(__file__).with_name("_nghttp2_ffi.py")

CDEF = """
typedef struct nghttp2_session nghttp2_session;
typedef struct nghttp2_session_callbacks nghttp2_session_callbacks;
typedef struct nghttp2_option nghttp2_option;

typedef struct {
  uint8_t *name;
  uint8_t *value;
  size_t namelen;
  size_t valuelen;
  uint8_t flags;
} nghttp2_nv;

typedef struct {
  size_t length;
  int32_t stream_id;
  uint8_t type;
  uint8_t flags;
  uint8_t reserved;
} nghttp2_frame_hd;

typedef union {
  nghttp2_frame_hd hd;
} nghttp2_frame;

typedef struct {
  int32_t settings_id;
  uint32_t value;
} nghttp2_settings_entry;

typedef union {
  int fd;
  void *ptr;
} nghttp2_data_source;

typedef ssize_t (*nghttp2_data_source_read_callback)(
    uint8_t session, int32_t stream_id, uint8_t *buf, size_t length, uint32_t *data_flags);

typedef struct {
  nghttp2_data_source source;
  nghttp2_data_source_read_callback read_callback;
} nghttp2_data_provider;

// The callbacks as the transport declares them, fewer arguments than nghttp2 passes: each
// argument cffi converts costs the callback, of which a call has about sixteen. Trailing
// arguments a callback does not read (``user_data``, a header's flags, a data source) are left
// out: the C calling conventions let a function ignore them (its caller removes them); the
// leading ones it does not read are declared ``uint8_t``, a small int, not a pointer object.
// The frame is declared as its first member, the header every frame type starts with (a
// pointer to the union is one to it). Bytes nghttp2 hands over are ``char`` (``ffi.unpack``
// makes them ``bytes`` at once).
typedef int (*nghttp2_on_invalid_frame_recv_callback)(
    uint8_t session, const nghttp2_frame_hd *frame, int lib_error_code);
typedef int (*nghttp2_on_data_chunk_recv_callback)(
    uint8_t session, uint8_t flags, int32_t stream_id, const char *data, size_t len);
typedef int (*nghttp2_on_stream_close_callback)(
    uint8_t session, int32_t stream_id, uint32_t error_code);

int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr);
void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks);
void nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(
    nghttp2_session_callbacks *cbs, nghttp2_on_invalid_frame_recv_callback cb);
void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
    nghttp2_session_callbacks *cbs, nghttp2_on_data_chunk_recv_callback cb);
void nghttp2_session_callbacks_set_on_stream_close_callback(
    nghttp2_session_callbacks *cbs, nghttp2_on_stream_close_callback cb);

int nghttp2_option_new(nghttp2_option **option_ptr);
void nghttp2_option_del(nghttp2_option *option);
void nghttp2_option_set_no_auto_window_update(nghttp2_option *option, int val);
void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val);
void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val);
void nghttp2_option_set_max_deflate_dynamic_table_size(nghttp2_option *option, size_t val);
void nghttp2_option_set_stream_reset_rate_limit(nghttp2_option *option, uint64_t burst,
    uint64_t rate);
void nghttp2_option_set_max_continuations(nghttp2_option *option, size_t val);

int nghttp2_session_server_new2(nghttp2_session **session_ptr,
    const nghttp2_session_callbacks *callbacks, void *user_data, const nghttp2_option *option);
void nghttp2_session_del(nghttp2_session *session);
ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *in, size_t inlen);
ssize_t nghttp2_session_mem_send(nghttp2_session *session, const char **data_ptr);
int nghttp2_session_want_read(nghttp2_session *session);
int nghttp2_session_want_write(nghttp2_session *session);
int nghttp2_session_consume(nghttp2_session *session, int32_t stream_id, size_t size);
int nghttp2_session_consume_connection(nghttp2_session *session, size_t size);
int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_set_local_window_size(nghttp2_session *session, uint8_t flags,
    int32_t stream_id, int32_t window_size);
int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session);
void *nghttp2_session_find_stream(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_get_stream_remote_close(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_terminate_session(nghttp2_session *session, uint32_t error_code);

int nghttp2_submit_settings(nghttp2_session *session, uint8_t flags,
    const nghttp2_settings_entry *iv, size_t niv);
int nghttp2_submit_response(nghttp2_session *session, int32_t stream_id,
    const nghttp2_nv *nva, size_t nvlen, const nghttp2_data_provider *data_prd);
int nghttp2_submit_trailer(nghttp2_session *session, int32_t stream_id,
    const nghttp2_nv *nva, size_t nvlen);
int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id,
    uint32_t error_code);
int nghttp2_submit_goaway(nghttp2_session *session, uint8_t flags, int32_t last_stream_id,
    uint32_t error_code, const uint8_t *opaque_data, size_t opaque_data_len);
int nghttp2_submit_shutdown_notice(nghttp2_session *session);
const char *nghttp2_strerror(int lib_error_code);

// HPACK alone: the transport's copy of each connection's decoder (:mod:`.h2blocks`).
typedef struct nghttp2_hd_inflater nghttp2_hd_inflater;
int nghttp2_hd_inflate_new(nghttp2_hd_inflater **inflater_ptr);
void nghttp2_hd_inflate_del(nghttp2_hd_inflater *inflater);
ssize_t nghttp2_hd_inflate_hd2(nghttp2_hd_inflater *inflater, nghttp2_nv *nv_out,
    int *inflate_flags, const uint8_t *in, size_t inlen, int in_final);
int nghttp2_hd_inflate_end_headers(nghttp2_hd_inflater *inflater);
size_t nghttp2_hd_inflate_get_num_table_entries(nghttp2_hd_inflater *inflater);
size_t nghttp2_hd_inflate_get_dynamic_table_size(nghttp2_hd_inflater *inflater);
const nghttp2_nv *nghttp2_hd_inflate_get_table_entry(nghttp2_hd_inflater *inflater, size_t idx);
"""


def generate(target: Path = TARGET) -> Path:
    """Write the out-of-line module for :data:`CDEF` to ``target``; returns ``target``."""
    import cffi  # type: ignore[import-untyped]  # only here: the daemon imports the result

    builder = cffi.FFI()
    builder.cdef(CDEF)
    builder.set_source(MODULE, None)
    builder.emit_python_code(str(target))
    return target


if __name__ == "__main__":
    print(generate(Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET))
