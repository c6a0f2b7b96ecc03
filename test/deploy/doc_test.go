// Package deploy checks the deployment files under deploy/ against the
// binary they deploy: the alert rules pass promtool, every config embedded in
// a manifest passes `sluice config check`, ports, probes, args and volume
// paths agree with the config and the binary's flags, and the metric names of
// the dashboard and the rules match what a running Sluice exports.
//
// The metric names live in one place: deploy/grafana/sluice-dashboard.json
// and deploy/prometheus/sluice-alerts.yaml. Nothing here lists them again.
package deploy
