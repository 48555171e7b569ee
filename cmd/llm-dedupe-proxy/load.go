package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
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
			out = append(out, setting{key: key, field: v.Field(i), secret: f.Tag.Get("secret") == "true"})
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
	fs.StringVar(&cf.path, "config", "", "YAML configuration `file` (env "+envPrefix+"CONFIG)")
	def := defaultConfig()
	for _, s := range settings(&def) {
		kf := &keyFlag{isBool: s.field.Kind() == reflect.Bool}
		cf.keys[s.key] = kf
		fs.Var(kf, s.key, fmt.Sprintf("`%s`; env %s; default %s",
			kindWord(s.field.Type()), s.env(), formatValue(s.field.Interface())))
	}
	return cf
}

// load returns the configuration made of the defaults, the file named by --config (or
// LLM_DEDUPE_CONFIG), the environment and the flags that were set, each overriding the one
// before, and validated. An environment variable set to "" counts as unset. List values given
// as text (environment, flags) are split on commas. getenv is os.LookupEnv outside tests: the
// environment is read here rather than by viper so that tests need not change the process's.
func (cf *configFlags) load(getenv func(string) (string, bool)) (Config, error) {
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
		for _, k := range v.AllKeys() {
			if !known[k] {
				errs = append(errs, &configError{Key: k, Rule: "unknown key in " + path})
			} else if x := v.Get(k); sections[k] && x != nil && reflect.TypeOf(x).Kind() != reflect.Map {
				errs = append(errs, &configError{Key: k, Rule: "must hold keys, not a value, in " + path})
			}
		}
	}

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
	return cfg, errors.Join(errs...)
}

// unknownEnv returns the names of environment variables (NAME=value) that start with
// LLM_DEDUPE_ but name no key: a misspelt variable would otherwise be ignored in silence.
func unknownEnv(environ []string) []string {
	def := defaultConfig()
	known := map[string]bool{envPrefix + "CONFIG": true}
	for _, s := range settings(&def) {
		known[s.env()] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] {
			out = append(out, name)
		}
	}
	return out
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

// kindWord names the type of a key in flag help.
func kindWord(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Slice:
		return "list"
	}
	return t.Kind().String()
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
