//! The verbs that `<infiniband/verbs.h>` defines `static inline`. The
//! data-path ones are each one indirect call through the provider's ops table, exactly as
//! the C definition compiles, with no wrapper function in between.
//!
//! Every op in `ibv_context.ops` is non-NULL once a context is open:
//! libibverbs fills the ops a provider leaves out with stubs that fail
//! with `EOPNOTSUPP` (rdma-core `libibverbs/dummy_ops.c`), so the pointer
//! is called without a check, as C calls it.

use std::mem::{offset_of, size_of};
use std::os::raw::c_int;

use crate::{
    _compat_ibv_port_attr, ibv_context, ibv_cq, ibv_port_attr, ibv_qp, ibv_recv_wr, ibv_send_wr,
    ibv_srq, ibv_wc, verbs_context,
};

/// `ibv_post_send(3)`.
///
/// # Safety
/// `qp` is a live QP of an open context; `wr` is a valid, NULL-terminated
/// list of work requests whose scatter/gather lists are valid for the
/// call; `bad_wr` is a valid out-pointer.
#[inline(always)]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let post = (*(*qp).context).ops.post_send.unwrap_unchecked();
    post(qp, wr, bad_wr)
}

/// `ibv_post_recv(3)`.
///
/// # Safety
/// As for [`ibv_post_send`], with receive work requests.
#[inline(always)]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let post = (*(*qp).context).ops.post_recv.unwrap_unchecked();
    post(qp, wr, bad_wr)
}

/// `ibv_poll_cq(3)`.
///
/// # Safety
/// `cq` is a live CQ of an open context and `wc` points at `num_entries`
/// writable `ibv_wc`.
#[inline(always)]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let poll = (*(*cq).context).ops.poll_cq.unwrap_unchecked();
    poll(cq, num_entries, wc)
}

/// `ibv_post_srq_recv(3)`.
///
/// # Safety
/// `srq` is a live shared receive queue of an open context; `wr` is a
/// valid, NULL-terminated list of receive work requests whose
/// scatter/gather lists are valid for the call; `bad_wr` is a valid
/// out-pointer.
#[inline(always)]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let post = (*(*srq).context).ops.post_srq_recv.unwrap_unchecked();
    post(srq, wr, bad_wr)
}

/// `ibv_req_notify_cq(3)`: the next completion added to `cq` (with
/// `solicited_only`, the next solicited one) raises one event on the CQ's
/// completion channel.
///
/// # Safety
/// `cq` is a live CQ of an open context, created with a completion
/// channel.
#[inline(always)]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let arm = (*(*cq).context).ops.req_notify_cq.unwrap_unchecked();
    arm(cq, solicited_only)
}

unsafe extern "C" {
    /// The exported entry point, which fills only the fields the
    /// `IBVERBS_1.1` ABI knew (a prefix of `ibv_port_attr`).
    #[link_name = "ibv_query_port"]
    fn ibv_query_port_compat(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut _compat_ibv_port_attr,
    ) -> c_int;
}

/// `ibv_query_port(3)`, as the header's inline `___ibv_query_port`: the
/// provider's extended entry point when the context has one, which fills
/// the whole struct, else the exported compat one over a zeroed struct.
///
/// # Safety
/// `context` is an open context and `port_attr` a valid out-pointer.
pub unsafe fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // `__VERBS_ABI_IS_EXTENDED`: the context is embedded in a verbs_context.
    let extended = (*context).abi_compat as usize == usize::MAX;
    if extended {
        let vctx = context
            .byte_sub(offset_of!(verbs_context, context))
            .cast::<verbs_context>();
        let has_op =
            (*vctx).sz >= size_of::<verbs_context>() - offset_of!(verbs_context, query_port);
        if let (true, Some(query)) = (has_op, (*vctx).query_port) {
            return query(context, port_num, port_attr, size_of::<ibv_port_attr>());
        }
    }
    std::ptr::write_bytes(port_attr, 0, 1);
    ibv_query_port_compat(context, port_num, port_attr.cast())
}
