// The `rdma` transport (rdma-core: libibverbs + librdmacm), the Lynx deployment: the SmartNIC
// reaches a region in another machine's or device's memory with one-sided RDMA only.
//
//  - RdmaRegionExporter is the agent side. It registers the region (host memory with
//    ibv_reg_mr; GPU memory with ibv_reg_dmabuf_mr, or ibv_reg_mr on the device pointer where
//    the peer-memory driver is loaded) and accepts rdma_cm connections, one RC queue pair per
//    SmartNIC connection. Its CPU does nothing on the data path; poll() only services
//    connection events.
//  - RdmaTransport is the SmartNIC side and satisfies Transport (transport.hpp): one RC queue
//    pair to one exporter, a registered staging image of the whole region, RDMA WRITE for
//    post_write and publish_index, RDMA READ for post_read.
//
// This header is the API: each side may also include only its own header (rdma_transport.hpp,
// rdma_exporter.hpp; rdma_region_address.hpp is what they share). Built only with
// CARACAL_HAVE_RDMA. Run here only on Soft-RoCE (rdma_rxe) inside the VM of tests/vm/rxe-vm.sh;
// the GPU-memory registrations compile everywhere but have never run (see mqueue/README.md).
#pragma once

#include "caracal/mqueue/rdma_exporter.hpp"
#include "caracal/mqueue/rdma_region_address.hpp"
#include "caracal/mqueue/rdma_transport.hpp"
