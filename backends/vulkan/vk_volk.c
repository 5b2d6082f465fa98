/* volk, compiled into kvq (Debian's libvulkan-volk-dev ships its source as /usr/include/volk.c).
 * Its symbols are hidden like all of kvq's (-fvisibility=hidden), so the host application's own
 * volk or loader function pointers are never touched. Its code is not ours: its warnings are off. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <volk.c>
#pragma GCC diagnostic pop
