package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// envPrefix starts every environment variable the binary reads.
const envPrefix = "LLM_DEDUPE_"

// setting is one configuration key and the Config field that holds it.
type setting struct {
	key    string        // the path of mapstructure tags, like "flight.lease_ttl"
	field  reflect.Value // addressable field of a Config
	secret bool
	help   string // its meaning, in a line
}

// env is the environment variable of the key: LLM_DEDUPE_FLIGHT_LEASE_TTL.
func (s setting) env() string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(s.key, ".", "_"))
}

// settings lists every key of cfg in the order the fields are declared. It is the one list that
// defaults, environment variables, flags, decoding and printing are made from, so no key can be
// missed by one of them.
func settings(cfg *Config) []setting {
	var out []setting
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			key := prefix + f.Tag.Get("mapstructure")
			if f.Type.Kind() == reflect.Struct {
				walk(key+".", v.Field(i))
				continue
			}
			out = append(out, setting{key: key, field: v.Field(i), secret: f.Tag.Get("secret") == "true", help: f.Tag.Get("help")})
		}
	}
	walk("", reflect.ValueOf(cfg).Elem())
	return out
}

// keyFlag is the command-line flag of one key. Its text is decoded like an environment value.
type keyFlag struct {
	value  string
	set    bool
	isBool bool
	word   string // the kind of value it takes, and its meaning, for help
	help   string
}

func (f *keyFlag) String() string     { return f.value }
func (f *keyFlag) Set(s string) error { f.value, f.set = s, true; return nil }
func (f *keyFlag) IsBoolFlag() bool   { return f.isBool }

// configFlags are the flags every subcommand that reads the configuration has: --config and
// one flag named after each key (--upstream.base_url, --flight.lease_ttl, …).
type configFlags struct {
	path string
	keys map[string]*keyFlag
}

func newConfigFlags(fs *flag.FlagSet) *configFlags {
	cf := &configFlags{keys: map[string]*keyFlag{}}
	fs.StringVar(&cf.path, "config", "", "YAML configuration `FILE` (env "+envPrefix+"CONFIG)")
	def := defaultConfig()
	for _, s := range settings(&def) {
		kf := &keyFlag{isBool: s.field.Kind() == reflect.Bool, word: kindWord(s.field.Type()), help: s.help}
		cf.keys[s.key] = kf
		// The default is the flag's DefValue, shown by help; the value itself stays unset
		// so that the environment and the file are not overridden.
		fs.Var(kf, s.key, s.help)
		fs.Lookup(s.key).DefValue = formatValue(s.field.Interface())
	}
	return cf
}

// load returns the configuration made of the defaults, the file named by --config (or
// LLM_DEDUPE_CONFIG), the environment and the flags that were set, each overriding the one
// before, and validated. An environment variable set to "" counts as unset. List values given
// as text (environment, flags) are split on commas. env is the whole environment: it is read
// here rather than by viper so that tests need not change the process's. A key of the file
// or an LLM_DEDUPE_ variable that names no key is refused alike, with the nearest key's
// name (see ADR 0054).
func (cf *configFlags) load(env map[string]string) (Config, error) {
	getenv := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	v := viper.NewWithOptions(viper.WithDecodeHook(decodeHook))
	def := defaultConfig()
	list := settings(&def)
	known, sections := map[string]bool{}, map[string]bool{}
	for _, s := range list {
		v.SetDefault(s.key, s.field.Interface())
		known[s.key] = true
		if section, _, ok := strings.Cut(s.key, "."); ok {
			known[section], sections[section] = true, true // "upstream:" with nothing under it is fine
		}
	}

	var errs []error
	path := cf.path
	if path == "" {
		path, _ = getenv(envPrefix + "CONFIG")
	}
	if path != "" {
		v.SetConfigFile(path)
		if filepath.Ext(path) == "" {
			v.SetConfigType("yaml")
		}
		if err := v.ReadInConfig(); err != nil {
			return Config{}, &configError{Key: "--config", Rule: err.Error()}
		}
		var names []string
		for _, s := range list {
			names = append(names, s.key)
		}
		for _, k := range v.AllKeys() {
			if !known[k] {
				errs = append(errs, &configError{Key: k, Rule: "unknown key in " + path + didYouMean(k, names, "%s")})
			} else if x := v.Get(k); sections[k] && x != nil && reflect.TypeOf(x).Kind() != reflect.Map {
				errs = append(errs, &configError{Key: k, Rule: "must hold keys, not a value, in " + path})
			}
		}
	}

	errs = append(errs, unknownEnv(env)...)

	// viper.Set is the top layer, so of the environment and the flags the later one wins.
	for _, s := range list {
		if val, ok := getenv(s.env()); ok && val != "" {
			v.Set(s.key, val)
		}
	}
	for _, s := range list {
		if f := cf.keys[s.key]; f != nil && f.set {
			v.Set(s.key, f.value)
		}
	}

	cfg := defaultConfig() // a key that cannot be decoded keeps its default for validate
	failed := map[string]bool{}
	for _, s := range settings(&cfg) {
		// Decode into a fresh value: decoding into a slice would reuse the default's array.
		p := reflect.New(s.field.Type())
		if err := v.UnmarshalKey(s.key, p.Interface()); err != nil {
			errs = append(errs, &configError{Key: s.key, Rule: fmt.Sprintf("cannot use %v as %s",
				formatValue(v.Get(s.key)), kindName(s.field.Type()))})
			failed[s.key] = true
			continue
		}
		s.field.Set(p.Elem())
	}
	if err := validate(cfg); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			if ce, ok := e.(*configError); !ok || !failed[ce.Key] {
				errs = append(errs, e)
			}
		}
	}
	// A value that came from the environment is named by its variable too: the key alone
	// sends the user looking in a file that does not hold it (ADR 0054).
	for _, e := range errs {
		if ce, ok := e.(*configError); ok {
			ce.Env = cf.fromEnv(env, ce.Key)
		}
	}
	return cfg, errors.Join(errs...)
}

// fromEnv returns the environment variable that set key, or "" when none did or a flag
// overrode it: what a message about the key's value names besides the key.
func (cf *configFlags) fromEnv(env map[string]string, key string) string {
	if f := cf.keys[key]; f == nil || f.set {
		return ""
	}
	name := setting{key: key}.env()
	if env[name] == "" {
		return ""
	}
	return name
}

// otherEnv are the LLM_DEDUPE_ variables that name no key and are not mistakes: the file
// to read, and those of the pprof build and of the benchmark harness.
var otherEnv = []string{envPrefix + "CONFIG", envPrefix + "PPROF_LISTEN", envPrefix + "BENCH_OWNERS"}

// unknownEnv returns an error for each variable of env that starts with LLM_DEDUPE_ but names
// no key, in the order of their names: a misspelt variable would otherwise be ignored, and
// a misspelt LLM_DEDUPE_REDIS_ADDRS leave several instances each on its own memory.
// Kubernetes's service links are no mistake (see serviceLink).
func unknownEnv(env map[string]string) []error {
	def := defaultConfig()
	known := map[string]bool{}
	var names []string
	for _, s := range settings(&def) {
		known[s.env()] = true
		names = append(names, s.env())
	}
	for _, name := range otherEnv {
		known[name] = true
	}
	var unknown []string
	for name, value := range env {
		if strings.HasPrefix(name, envPrefix) && !known[name] && !serviceLink(name, value) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	var errs []error
	for _, name := range unknown {
		errs = append(errs, &configError{Key: name, Rule: "an environment variable that names no key" + didYouMean(name, names, "%s")})
	}
	return errs
}

// serviceLinkName matches the variables Kubernetes gives a pod for each Service of its
// namespace, named after the Service: a Service "llm-dedupe-proxy" makes
// LLM_DEDUPE_PROXY_SERVICE_HOST, LLM_DEDUPE_PROXY_PORT_8080_TCP_ADDR and others, which
// start with our prefix and are none of ours.
var serviceLinkName = regexp.MustCompile(`^[A-Z0-9_]*(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)

// serviceLink reports whether name=value is one of Kubernetes's service-link variables:
// one serviceLinkName matches, or a name ending in PORT whose value is an address such as
// tcp://10.0.0.1:8080.
func serviceLink(name, value string) bool {
	if serviceLinkName.MatchString(name) {
		return true
	}
	if strings.HasSuffix(name, "_PORT") {
		for _, proto := range []string{"tcp://", "udp://", "sctp://"} {
			if strings.HasPrefix(value, proto) {
				return true
			}
		}
	}
	return false
}

var durationType = reflect.TypeFor[time.Duration]()

// decodeHook reads durations in Go syntax ("1m30s"; a bare 0 is allowed, other bare numbers
// have no unit and are refused) and splits text into a list on commas, trimming spaces.
func decodeHook(from, to reflect.Type, data any) (any, error) {
	switch {
	case to == durationType:
		if s, ok := data.(string); ok {
			return time.ParseDuration(strings.TrimSpace(s))
		}
		if from != durationType && data != nil && !reflect.ValueOf(data).IsZero() {
			return nil, errors.New("a bare number has no unit")
		}
	case isInt(to.Kind()) && (from.Kind() == reflect.Float64 || from.Kind() == reflect.Float32):
		// A YAML 2.5 would be cut to 2 without a word; an environment variable's "2.5" is
		// refused, and so is it.
		if f := reflect.ValueOf(data).Float(); f != math.Trunc(f) {
			return nil, fmt.Errorf("%v is not an integer", f)
		}
	case to.Kind() == reflect.Slice && from.Kind() == reflect.String:
		out := []string{}
		for _, item := range strings.Split(data.(string), ",") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
		return out, nil
	}
	return data, nil
}

func isInt(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Int64 || k >= reflect.Uint && k <= reflect.Uint64
}

// kindName says in words what a key of type t takes.
func kindName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration (like 500ms, 3s, 10m)"
	case t.Kind() == reflect.Bool:
		return "a boolean (true or false)"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.String:
		return "a string"
	}
	return "an integer"
}

var _ mapstructure.DecodeHookFuncType = decodeHook
