// What KMEANS_ASSIGN and KMEANS_UPDATE share. The job's sizes (kvq_job_kmeans, backends/backend.h)
// are 4 words at `meta`: problems, points, dims, clusters. A dispatch covers a range [range_first,
// range_first + count) of the clusters (ASSIGN) or of the points (UPDATE): backends/vulkan/vk_kmeans.c
// splits a job into such ranges for the loop limit (docs/VULKAN.md), and keeps every word index
// below 2^32.
#define KVQ_KM_PROBLEMS meta[pc.meta]
#define KVQ_KM_POINTS meta[pc.meta + 1u]
#define KVQ_KM_DIMS meta[pc.meta + 2u]
#define KVQ_KM_CLUSTERS meta[pc.meta + 3u]
