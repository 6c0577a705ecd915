//! The layouts the provider reads and writes on the data path, pinned to
//! the C ABI of 64-bit Linux (rdma-core's `verbs.h`): a header or bindgen
//! change that moved a field would fail here, not in the NIC.

use std::mem::{offset_of, size_of};

use crate::*;

#[test]
fn scatter_gather_and_receive_requests() {
    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(offset_of!(ibv_sge, length), 8);
    assert_eq!(offset_of!(ibv_sge, lkey), 12);
    assert_eq!(size_of::<ibv_recv_wr>(), 32);
    assert_eq!(offset_of!(ibv_recv_wr, next), 8);
    assert_eq!(offset_of!(ibv_recv_wr, sg_list), 16);
    assert_eq!(offset_of!(ibv_recv_wr, num_sge), 24);
}

#[test]
fn send_requests() {
    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(offset_of!(ibv_send_wr, next), 8);
    assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
    assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
    assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
    // The imm_data / invalidate_rkey union, then the per-opcode `wr` union
    // whose `rdma` member is remote_addr then rkey.
    assert_eq!(offset_of!(ibv_send_wr, __bindgen_anon_1), 36);
    assert_eq!(offset_of!(ibv_send_wr, wr), 40);
}

#[test]
fn work_completions() {
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(offset_of!(ibv_wc, status), 8);
    assert_eq!(offset_of!(ibv_wc, opcode), 12);
    assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
    assert_eq!(offset_of!(ibv_wc, byte_len), 20);
    assert_eq!(offset_of!(ibv_wc, __bindgen_anon_1), 24);
    assert_eq!(offset_of!(ibv_wc, qp_num), 28);
    assert_eq!(offset_of!(ibv_wc, src_qp), 32);
    assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
}

#[test]
fn the_ops_table_holds_the_data_path_verbs() {
    // The inline verbs call these five slots of `struct ibv_context_ops`
    // (checked against offsetof() over rdma-core 44's header).
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 8 * 11);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 8 * 12);
    assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 8 * 20);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 8 * 25);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 8 * 26);
    assert_eq!(offset_of!(ibv_context, ops), 8);
}

#[test]
fn flag_values_are_the_abi_ones() {
    assert_eq!(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0, 1);
    assert_eq!(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0, 2);
    assert_eq!(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0, 4);
    assert_eq!(ibv_send_flags::IBV_SEND_SIGNALED.0, 2);
    assert_eq!(ibv_send_flags::IBV_SEND_INLINE.0, 8);
    assert_eq!(ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0);
    assert_eq!(ibv_wr_opcode::IBV_WR_SEND, 2);
    assert_eq!(ibv_wr_opcode::IBV_WR_RDMA_READ, 4);
}
