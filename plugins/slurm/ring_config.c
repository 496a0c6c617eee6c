/*
 * ring_config.c - the arguments after the plugin path in plugstack.conf:
 *
 *   required /usr/lib/slurm/spank_ringmaster.so default_coord=tcp://head:5555 allow_tcp=1
 *
 * Parsed strictly: an unknown key, a word that is not key=value, a key given twice or a bad
 * value is an error (the plugin refuses to initialise, so no step starts with a half-read
 * configuration). Defaults: no default_coord, allow_tcp=1.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ring_spank.h"

#define KNOWN_KEYS "default_coord=ENDPOINT, allow_tcp=0|1"

/* Logs the error and keeps it in cfg->error (slurmstepd repeats it where the user sees it). */
static int cfg_error(struct ring_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int cfg_error(struct ring_config *cfg, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(cfg->error, sizeof(cfg->error), fmt, ap);
  va_end(ap);
  slurm_error(RING_LOG_PREFIX "%s", cfg->error);
  return -1;
}

int ring_config_parse(struct ring_config *cfg, int ac, char **av) {
  char err[RING_ERR_MAX];
  int seen_coord = 0, seen_tcp = 0;

  memset(cfg, 0, sizeof(*cfg));
  cfg->allow_tcp = 1;

  for (int i = 0; i < ac; i++) {
    const char *arg = av[i] ? av[i] : "";
    const char *eq = strchr(arg, '=');
    const char *val = eq ? eq + 1 : NULL;

    if (!eq || eq == arg)
      return cfg_error(
          cfg, "plugstack.conf: argument '%.128s' is not key=value (known: " KNOWN_KEYS ")", arg);
    if (strncmp(arg, "default_coord=", 14) == 0) {
      if (seen_coord++) return cfg_error(cfg, "plugstack.conf: default_coord is given twice");
      /* checked against allow_tcp below, whatever the argument order */
      if (ring_validate_endpoint(val, 1, err, sizeof(err)) != RING_OK)
        return cfg_error(cfg, "plugstack.conf: default_coord=%.128s: %s", val, err);
      snprintf(cfg->default_coord, sizeof(cfg->default_coord), "%s", val);
      cfg->has_default_coord = 1;
    } else if (strncmp(arg, "allow_tcp=", 10) == 0) {
      if (seen_tcp++) return cfg_error(cfg, "plugstack.conf: allow_tcp is given twice");
      if (ring_parse_bool01(val, &cfg->allow_tcp, err, sizeof(err)) != RING_OK)
        return cfg_error(cfg, "plugstack.conf: allow_tcp=%.32s: %s", val, err);
    } else {
      return cfg_error(cfg, "plugstack.conf: unknown argument '%.*s' (known: " KNOWN_KEYS ")",
                       (int)(eq - arg > 64 ? 64 : eq - arg), arg);
    }
  }
  if (cfg->has_default_coord &&
      ring_validate_endpoint(cfg->default_coord, cfg->allow_tcp, err, sizeof(err)) != RING_OK)
    return cfg_error(cfg, "plugstack.conf: default_coord=%s: %s", cfg->default_coord, err);
  return 0;
}
