package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// flights prints the flights in progress, as GET /admin/flights of the running proxy (at
// admin.listen, with admin.token) answers them: on every instance with Redis. Keys are
// printed whole, so that one can be given to DELETE /admin/answers/{key} as it is: a prefix
// unique among the flights listed need not be unique among the answers stored, which
// cannot be listed (see ADR 0054).
func (a *app) flights(args []string) int {
	c := lookupCommand("flights")
	fs, cf := a.flagSet(c)
	limit := fs.Int("limit", 1000, "most flights to list (1 to 10000)")
	asJSON := fs.Bool("json", false, "print the admin API's JSON as it came")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	if code, done := a.parse(c, fs, args, 0); done {
		return code
	}
	cfg, err := cf.load(a.env)
	// What flights needs is told as what to pass, before the rules serve is held to
	// (ADR 0054).
	if cfg.Admin.Listen == "" {
		fmt.Fprintln(a.stderr, "llm-dedupe-proxy flights: no admin API address: pass the running proxy's admin.listen as\n"+
			"--admin.listen=HOST:PORT (or LLM_DEDUPE_ADMIN_LISTEN, or admin.listen in the --config file)")
		return 2
	}
	if cfg.Admin.Token == "" {
		fmt.Fprintln(a.stderr, "llm-dedupe-proxy flights: no admin token: pass the running proxy's admin.token as\n"+
			"--admin.token=TOKEN or LLM_DEDUPE_ADMIN_TOKEN=TOKEN (or admin.token in the --config file)")
		return 2
	}
	if err != nil {
		return a.invalidConfig(err)
	}
	base, err := localBase(cfg.Admin.Listen)
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy flights: admin.listen %q: %v\n", cfg.Admin.Listen, err)
		return 1
	}
	url := base + "/admin/flights?limit=" + strconv.Itoa(*limit)
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
	resp, err := (&http.Client{Timeout: *timeout}).Do(req)
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy flights: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy flights: %v\n", err)
		return 1
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy flights: %s answered %d: %s\n", url, resp.StatusCode, body)
		return 1
	}
	if *asJSON {
		_, _ = a.stdout.Write(body)
		return 0
	}
	var list proxy.FlightsJSON
	if err := json.Unmarshal(body, &list); err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy flights: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tOWNER\tATTEMPT\tAGE\tLEASE LEFT\tWAITING\tROUTE\tMODEL")
	for _, f := range list.Flights {
		lease := "-"
		if f.LeaseLeftMs > 0 {
			lease = ms(f.LeaseLeftMs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", shown(f.Key), shown(f.State), shown(f.Owner), f.Attempt, ms(f.AgeMs), lease,
			waiting(f.Waiting), shown(f.Route), shown(f.Model))
	}
	_ = tw.Flush()
	more := ""
	if list.Truncated {
		more = " (more not shown)"
	}
	noun := "flights"
	if len(list.Flights) == 1 {
		noun = "flight"
	}
	fmt.Fprintf(a.stdout, "%d %s in progress (%s)%s\n", len(list.Flights), noun, list.Backend, more)
	return 0
}

// waiting is how many clients wait per instance, by id: "5f0c=1,b7c2=3".
func waiting(w map[string]int) string {
	if len(w) == 0 {
		return "-"
	}
	ids := slices.Sorted(maps.Keys(w))
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = shown(id) + "=" + strconv.Itoa(w[id])
	}
	return strings.Join(parts, ",")
}

// shown is s as it may be printed to a terminal: a client chose the model (and Redis holds
// the rest), so a string with a control character or a tab is shown quoted, escaped, and
// cannot add a row or move the terminal.
func shown(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

func ms(n int64) string {
	return (time.Duration(n) * time.Millisecond).Round(time.Millisecond).String()
}
