package lincheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

// Operation is one operation of a History.
type Operation struct {
	// Client is the logical client that called it; Row its row in the
	// visualisation (porcupine's client ID).
	Client int `json:"client"`
	Row    int `json:"row"`
	// Input and Output are the call and its result (Output.Unknown for an
	// operation whose outcome is unknown).
	Input  Input  `json:"input"`
	Output Output `json:"output"`
	// Call and Return are recorder timestamps; an unknown operation returns
	// at History.End.
	Call   int64 `json:"call"`
	Return int64 `json:"return"`
	// Error is the error that ended the operation, if any.
	Error string `json:"error,omitempty"`
}

// History is a recorded history ready to check: the operations with a
// known or unknown outcome (failed ones and unknown reads are left out).
type History struct {
	// Ops are the operations in call order.
	Ops []Operation `json:"ops"`
	// End is after every timestamp of the history; operations with an
	// unknown outcome return there.
	End int64 `json:"end"`
	// Annotations mark events (faults) on the visualisation's timeline.
	Annotations []Annotation `json:"annotations,omitempty"`
	// Stats count all recorded operations by outcome.
	Stats Stats `json:"stats"`
	// Info is free-form context saved with the history (a seed, say).
	Info map[string]string `json:"info,omitempty"`
}

// Operations converts the history to porcupine operations.
func (h *History) Operations() []porcupine.Operation {
	out := make([]porcupine.Operation, len(h.Ops))
	for i, op := range h.Ops {
		meta := fmt.Sprintf("client %d", op.Client)
		if op.Error != "" {
			meta += ": " + op.Error
		}
		out[i] = porcupine.Operation{
			ClientId: op.Row,
			Input:    op.Input,
			Output:   op.Output,
			Call:     op.Call,
			Return:   op.Return,
			Metadata: meta,
		}
	}
	return out
}

// WriteFile saves the history as JSON.
func (h *History) WriteFile(path string) error {
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadHistory loads a history saved by History.WriteFile (or by Check).
func ReadHistory(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	h := &History{}
	if err := json.Unmarshal(b, h); err != nil {
		return nil, fmt.Errorf("lincheck: read history %s: %w", path, err)
	}
	return h, nil
}

// Result is the verdict of Check.
type Result struct {
	// Outcome is porcupine's verdict: porcupine.Ok (linearizable),
	// porcupine.Illegal (a violation) or porcupine.Unknown (the check ran
	// out of time).
	Outcome porcupine.CheckResult
	// Duration is how long the check took.
	Duration time.Duration
	// HistoryPath and VisualizationPath are the files written when the
	// outcome is not Ok (empty otherwise, or when no directory was given).
	HistoryPath       string
	VisualizationPath string
}

// OK reports whether the history was found linearizable.
func (r Result) OK() bool { return r.Outcome == porcupine.Ok }

// String describes the verdict.
func (r Result) String() string {
	var s string
	switch r.Outcome {
	case porcupine.Ok:
		s = "linearizable"
	case porcupine.Illegal:
		s = "NOT linearizable"
	default:
		s = "undecided (check timed out)"
	}
	s += fmt.Sprintf(" (checked in %v)", r.Duration.Round(time.Millisecond))
	if r.VisualizationPath != "" {
		s += "; visualisation: " + r.VisualizationPath
	}
	if r.HistoryPath != "" {
		s += "; history: " + r.HistoryPath
	}
	return s
}

// maxVisualizedOps bounds the histories Check draws.
const maxVisualizedOps = 1_000_000

// Check checks h for linearizability, giving porcupine timeout (0 for
// none) in all. A history is linearizable when each key's operations are
// (the model's keys are independent), and Check checks the keys one after
// another, so that memory holds one key's search at a time: porcupine's
// own parallel check of a 3-million-operation history (a 30-minute chaos
// run) took more than 22 GiB. When the outcome is not Ok and outDir is not
// empty, it writes the history (history.json) into outDir, creating it,
// and, for a key shown not linearizable, porcupine's visualisation of that
// key's operations (visualization.html, with h's annotations) when they
// are at most maxVisualizedOps; it returns their paths in the Result. The
// error reports only a failure to write those files.
func Check(h *History, timeout time.Duration, outDir string) (Result, error) {
	model := Model()
	start := time.Now()
	res := Result{Outcome: porcupine.Ok}
	var bad []porcupine.Operation // the first key shown not linearizable
	for _, part := range partitionByKey(h.Operations()) {
		left := time.Duration(0)
		if timeout > 0 {
			if left = timeout - time.Since(start); left <= 0 {
				res.Outcome = porcupine.Unknown
				break
			}
		}
		switch porcupine.CheckOperationsTimeout(model, part, left) {
		case porcupine.Illegal:
			res.Outcome, bad = porcupine.Illegal, part
		case porcupine.Unknown:
			res.Outcome = porcupine.Unknown
		}
		if bad != nil {
			break
		}
	}
	res.Duration = time.Since(start)
	if res.Outcome == porcupine.Ok || outDir == "" {
		return res, nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return res, err
	}
	res.HistoryPath = filepath.Join(outDir, "history.json")
	if err := h.WriteFile(res.HistoryPath); err != nil {
		return res, err
	}
	// Check the failing key again, collecting the partial linearizations
	// to draw (a check that timed out has nothing to show).
	if bad == nil || len(bad) > maxVisualizedOps {
		return res, nil
	}
	_, info := porcupine.CheckOperationsVerbose(model, bad, timeout)
	info.AddAnnotations(h.porcupineAnnotations())
	res.VisualizationPath = filepath.Join(outDir, "visualization.html")
	if err := porcupine.VisualizePath(model, info, res.VisualizationPath); err != nil {
		return res, fmt.Errorf("lincheck: write visualisation: %w", err)
	}
	return res, nil
}

func (h *History) porcupineAnnotations() []porcupine.Annotation {
	out := make([]porcupine.Annotation, 0, len(h.Annotations))
	for _, a := range h.Annotations {
		out = append(out, porcupine.Annotation{
			Tag:             a.Tag,
			Start:           a.Start,
			End:             a.End,
			Description:     a.Description,
			Details:         a.Details,
			BackgroundColor: "#ffd8a8",
		})
	}
	return out
}
