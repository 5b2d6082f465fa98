// What KMEANS_ASSIGN and KMEANS_UPDATE share. The job's sizes (kvq_job_kmeans, backends/backend.h)
// are 4 words at `meta`: problems, points, dims, clusters. A dispatch covers a range [first,
// first + count) of the clusters (ASSIGN) or of the points (UPDATE): backends/vulkan/vk_kmeans.c
// splits a job into such ranges to keep within llvmpipe's loop bound, and keeps every word index
// below 2^32.
//
// Loop bound: llvmpipe (lavapipe) counts the loop trips of a shader invocation, all loops together
// (a loop of n iterations counts n + 1, the halfconv.h loop of every fp16 read at least 1), and
// silently leaves every loop once the count reaches 65535. A search over 2^b centroids of c dims
// counts about 2^b (c + 2), more than that at b = 12, c = 16, so the callers keep their invocations
// to about half of the bound: CQ searches one channel group per invocation, two dims per trip
// (core/methods/cq.h), and the host splits KMEANS_ASSIGN's clusters and KMEANS_UPDATE's points into
// ranges (vk_kmeans.c).
#define KVQ_KM_PROBLEMS meta[pc.meta]
#define KVQ_KM_POINTS meta[pc.meta + 1u]
#define KVQ_KM_DIMS meta[pc.meta + 2u]
#define KVQ_KM_CLUSTERS meta[pc.meta + 3u]
