/* What pinpoll binds: the verbs and the connection manager. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
