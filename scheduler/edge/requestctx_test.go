package edge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequestCtxIsNeverAContextParent guards the race CI once caught in
// TestRequestCtxIsNeverAContextParent: a context derived from a *fasthttp.RequestCtx
// outlives the handler in context's propagation goroutine, which reads the
// RequestCtx after fasthttp has recycled it. The race shows only under load, so
// this checks the source of the client edge, the only room that sees a
// RequestCtx: no context.With* call may take a RequestCtx parameter as its
// parent.
func TestRequestCtxIsNeverAContextParent(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		// Every function with a RequestCtx parameter, declared or literal
		// (a handler built inside another function); a call inside a nested
		// literal is reported once.
		reported := map[token.Pos]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				ft, body = fn.Type, fn.Body
			case *ast.FuncLit:
				ft, body = fn.Type, fn.Body
			default:
				return true
			}
			rcs := requestCtxParams(ft)
			if len(rcs) == 0 || body == nil {
				return true
			}
			checked++
			ast.Inspect(body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 || reported[call.Pos()] {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !strings.HasPrefix(sel.Sel.Name, "With") {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "context" {
					return true
				}
				if id, ok := call.Args[0].(*ast.Ident); ok && rcs[id.Name] {
					reported[call.Pos()] = true
					t.Errorf("%s: context.%s parented on the *fasthttp.RequestCtx %q; use opContext or the edge's base",
						fset.Position(call.Pos()), sel.Sel.Name, id.Name)
				}
				return true
			})
			return true
		})
	}
	require.Greater(t, checked, 10, "the scan found the handlers")
}

// requestCtxParams names the parameters of type *fasthttp.RequestCtx.
func requestCtxParams(ft *ast.FuncType) map[string]bool {
	out := map[string]bool{}
	for _, p := range ft.Params.List {
		star, ok := p.Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		sel, ok := star.X.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "RequestCtx" {
			continue
		}
		for _, n := range p.Names {
			out[n.Name] = true
		}
	}
	return out
}
