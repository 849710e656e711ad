/* Consumer of the installed C API (libdsmla_c). */
#include <stdio.h>
#include <string.h>

#include "dsmla/dsmla.h"
#include "dsmla/version.h"

int main(void) {
  if (strcmp(dsmla_version(), DSMLA_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer_c: library version %s, header %s\n", dsmla_version(), DSMLA_VERSION_STRING);
    return 1;
  }
  if (dsmla_cache_bytes_per_token(DSMLA_CACHE_FP8_DS_MLA) != 656) {
    fprintf(stderr, "consumer_c: fp8_ds_mla token is not 656 bytes\n");
    return 1;
  }
  dsmla_options options;
  dsmla_default_options(&options);
  options.num_heads = 16;
  dsmla_attention* handle = NULL;
  if (dsmla_create(DSMLA_BACKEND_CPU, &options, &handle) != DSMLA_OK) {
    fprintf(stderr, "consumer_c: dsmla_create: %s\n", dsmla_last_error());
    return 1;
  }
  dsmla_destroy(handle);
  printf("consumer_c: dsmla %s\n", dsmla_version());
  return 0;
}
