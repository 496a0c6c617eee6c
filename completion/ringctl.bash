# bash completion for ringctl (installed as share/bash-completion/completions/ringctl).
#
# Subcommands and each subcommand's flags are read from `ringctl --help` and `ringctl SUB --help`
# of the ringctl being completed (cached per shell), so they always match that binary. Job ids
# come from `ringctl status` (1 s timeout: nothing when no coordinator answers); spec arguments
# complete to *.yaml / *.yml files and directories (simulate too, and its flags' named choices);
# `tokenize` inputs to files and directories, its --tokenizer to *.model files, its --dtype to
# uint16 / uint32; `eval` and `generate` --checkpoint to directories, eval's named choices
# (--source, --dtype, --backend, --passkey).

# The help text of "ringctl [SUB]", cached per binary and subcommand.
declare -gA _ringctl_help_cache 2>/dev/null || true
_ringctl_help() {
  local cmd=$1 sub=$2 key="$1|$2"
  if [[ -z ${_ringctl_help_cache[$key]+set} ]]; then
    if [[ -n $sub ]]; then
      _ringctl_help_cache[$key]=$("$cmd" "$sub" --help 2>&1)
    else
      _ringctl_help_cache[$key]=$("$cmd" --help 2>&1)
    fi
  fi
  printf '%s\n' "${_ringctl_help_cache[$key]}"
}

# Subcommand names: the lines of the "Subcommands:" section (CLI11's help layout).
_ringctl_subcommands() {
  _ringctl_help "$1" "" | awk '
    tolower($0) ~ /^subcommands:/ { f = 1; next }
    /^[^ ]/ { f = 0 }
    f && $1 ~ /^[a-z][-a-z0-9]*$/ { print $1 }'
}

# Flags of a subcommand (or of ringctl itself): every -x / --name at the start of a help line.
_ringctl_flags() {
  _ringctl_help "$1" "$2" | awk '
    /^ +-/ { n = split($1, names, ","); for (i = 1; i <= n; i++) if (names[i] ~ /^-/) print names[i] }'
}

# True when flag $3 of subcommand $2 takes a value (its help line names a type: TEXT, INT, ...).
_ringctl_flag_takes_value() {
  _ringctl_help "$1" "$2" | awk -v flag="$3" '
    /^ +-/ { n = split($1, names, ","); for (i = 1; i <= n; i++)
               if (names[i] == flag) { found = 1; if ($2 ~ /^[A-Z][A-Z:]*$/) v = 1 } }
    END { exit !(found && v) }'
}

# Job ids the coordinator knows: the first column of `ringctl status` without its header.
_ringctl_jobs() {
  timeout 2 "$1" status --timeout 1 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $1 }'
}

_ringctl() {
  local cur prev cmd sub="" i w
  COMPREPLY=()
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD - 1]}
  cmd=${COMP_WORDS[0]}
  cmd=${cmd/#\~/$HOME}
  if ! command -v "$cmd" >/dev/null 2>&1; then return 0; fi

  # The subcommand: the first word before the cursor that names one (global flags may precede it).
  local subs
  subs=$(_ringctl_subcommands "$cmd")
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [[ $w != -* ]] && grep -qxF -- "$w" <<<"$subs"; then sub=$w; break; fi
  done

  if [[ -z $sub ]]; then
    if [[ $cur == -* ]]; then
      mapfile -t COMPREPLY < <(compgen -W "$(_ringctl_flags "$cmd" "")" -- "$cur")
    else
      mapfile -t COMPREPLY < <(compgen -W "$subs" -- "$cur")
    fi
    return 0
  fi

  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_ringctl_flags "$cmd" "$sub")" -- "$cur")
    return 0
  fi

  # tokenize: the two token widths; the tokenizer is a *.model file.
  if [[ $sub == tokenize && $prev == --dtype ]]; then
    mapfile -t COMPREPLY < <(compgen -W "uint16 uint32" -- "$cur")
    return 0
  fi
  if [[ $sub == tokenize && $prev == --tokenizer ]]; then
    mapfile -t COMPREPLY < <(compgen -f -X '!*.model' -- "$cur"; compgen -d -- "$cur")
    compopt -o filenames 2>/dev/null
    return 0
  fi

  # simulate and plan --search: the named choices of their flags; --topology also takes a file.
  case $sub:$prev in
    simulate:--topology | plan:--topology)
      mapfile -t COMPREPLY < <(compgen -W "fat-tree dragonfly+ torus3d" -- "$cur"; compgen -f -- "$cur")
      compopt -o filenames 2>/dev/null; return 0 ;;
    simulate:--gpu | plan:--gpu) mapfile -t COMPREPLY < <(compgen -W "H100 H200 A100 cpu" -- "$cur"); return 0 ;;
    simulate:--ring-order) mapfile -t COMPREPLY < <(compgen -W "natural topology" -- "$cur"); return 0 ;;
    simulate:--stagger) mapfile -t COMPREPLY < <(compgen -W "on off" -- "$cur"); return 0 ;;
    simulate:--routing) mapfile -t COMPREPLY < <(compgen -W "minimal valiant" -- "$cur"); return 0 ;;
    simulate:--node-names) mapfile -t COMPREPLY < <(compgen -W "wired shuffled" -- "$cur"); return 0 ;;
    simulate:--shard) mapfile -t COMPREPLY < <(compgen -W "none optimizer full" -- "$cur"); return 0 ;;
    simulate:--compression) mapfile -t COMPREPLY < <(compgen -W "none topk" -- "$cur"); return 0 ;;
    simulate:--expand) mapfile -t COMPREPLY < <(compgen -W "auto full reduced" -- "$cur"); return 0 ;;
    simulate:--calibration | plan:--calibration)
      mapfile -t COMPREPLY < <(compgen -f -X '!*.json' -- "$cur"; compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null; return 0 ;;
  esac

  # The value of a flag: directories for --*dir, files for other typed values.
  case $sub:$prev in
    import:--dtype) mapfile -t COMPREPLY < <(compgen -W "fp32 bf16 fp16" -- "$cur"); return 0 ;;
    export:--dtype) mapfile -t COMPREPLY < <(compgen -W "bf16 fp32" -- "$cur"); return 0 ;;
    import:-o | import:--output | export:-o | export:--output)
      mapfile -t COMPREPLY < <(compgen -d -- "$cur"); compopt -o filenames 2>/dev/null; return 0 ;;
    # eval: its named choices; the checkpoint is a directory, the spec a YAML file.
    eval:--source) mapfile -t COMPREPLY < <(compgen -W "text tokens" -- "$cur"); return 0 ;;
    eval:--dtype) mapfile -t COMPREPLY < <(compgen -W "fp32 bf16" -- "$cur"); return 0 ;;
    eval:--backend) mapfile -t COMPREPLY < <(compgen -W "cpu cuda" -- "$cur"); return 0 ;;
    eval:--passkey) mapfile -t COMPREPLY < <(compgen -W "0.1,0.5,0.9 random" -- "$cur"); return 0 ;;
    eval:--checkpoint | generate:--checkpoint)
      mapfile -t COMPREPLY < <(compgen -d -- "$cur"); compopt -o filenames 2>/dev/null; return 0 ;;
    eval:--spec)
      mapfile -t COMPREPLY < <(compgen -f -X '!*.y*ml' -- "$cur"; compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null; return 0 ;;
  esac
  if [[ $prev == -* ]] && _ringctl_flag_takes_value "$cmd" "$sub" "$prev"; then
    case $prev in
      *dir) mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
      *) mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
    esac
    return 0
  fi

  case $sub in
    validate | plan | run | submit | simulate)
      mapfile -t COMPREPLY < <(compgen -f -X '!*.yaml' -- "$cur"
        compgen -f -X '!*.yml' -- "$cur"; compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null
      ;;
    status | events | logs | cancel | restart)
      mapfile -t COMPREPLY < <(compgen -W "$(_ringctl_jobs "$cmd")" -- "$cur")
      ;;
    tokenize)
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      compopt -o filenames 2>/dev/null
      ;;
    checkpoints)
      mapfile -t COMPREPLY < <(compgen -W "$(_ringctl_jobs "$cmd")" -- "$cur"; compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null
      ;;
    import)  # a model directory or one .safetensors file
      mapfile -t COMPREPLY < <(compgen -f -X '!*.safetensors' -- "$cur"; compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null
      ;;
    export)  # a checkpoint directory or a step directory
      mapfile -t COMPREPLY < <(compgen -d -- "$cur")
      compopt -o filenames 2>/dev/null
      ;;
  esac
  return 0
}

complete -F _ringctl ringctl
